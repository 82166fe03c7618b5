"""One run per output: the flow's process holds the output's driver lease for the whole run.

A second run of a job into the same output (another deployment, a manual run beside a scheduled one, a
`prefixflow run`) is refused by the pipeline's lease (OutputBusy, naming the run that writes there) before
it plans or writes anything; the flow fails with that message. A run whose process was killed (a worker
SIGKILLed, its machine lost) leaves a dead driver lease behind; the next run reports it and, when it was a
Prefect flow run that the API still shows as running, marks that run Crashed, so the UI does not show a
dead run as running forever.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect.context import FlowRunContext

from prefixflow.pipeline import JobSpec, hold_output

REF_PREFIX = "prefect-flow-run:"


@contextmanager
def drive_output(spec: JobSpec, logger: Any) -> Iterator[None]:
    """Hold ``spec.output``'s driver lease for the block, as this Prefect flow run."""
    context = FlowRunContext.get()
    run = context.flow_run if context is not None else None
    name = f"Prefect flow run '{run.name}' ({run.id})" if run is not None else "a Prefect flow run"
    ref = f"{REF_PREFIX}{run.id}" if run is not None else ""
    with hold_output(spec, driver=name, ref=ref) as dead:
        for lease in dead:
            logger.warning(
                "%s died without finishing its run on this output: %s", lease.driver, _mark_crashed(lease.ref)
            )
        yield


def _mark_crashed(ref: str) -> str:
    """Set the dead run's Prefect state to Crashed if the API still shows it running; says what was done."""
    from prefect import get_client
    from prefect.states import Crashed

    if not ref.startswith(REF_PREFIX):
        return "not a Prefect flow run, nothing to mark"
    run_id = uuid.UUID(ref.removeprefix(REF_PREFIX))
    with get_client(sync_client=True) as client:
        try:
            run = client.read_flow_run(run_id)
        except Exception as exc:  # noqa: BLE001 - another server, or deleted: nothing to mark here
            return f"flow run {run_id} is not in this Prefect API ({type(exc).__name__})"
        if run.state is not None and run.state.is_final():
            return f"flow run {run_id} is already {run.state.name}"
        message = "its process died mid-run (its output lease went stale); a later run resumed the output"
        client.set_flow_run_state(run_id, Crashed(message=message))  # frees its deployment slot
    return f"marked flow run {run_id} Crashed; this run resumes its committed shards"
