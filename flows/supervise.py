"""Watch the lane tasks until every one has finished; resubmit a Ray lane whose node or worker died.

Prefect's own task retries (`lane_retries`) cover a lane that *raises*: they run again in the same
process. A Ray node that dies (SIGKILL, preemption, OOM) takes that process with it, so Prefect never
sees the failure: the Ray future fails with `NodeDiedError` / `WorkerCrashedError` and the task run
would stay `Running` in the API. The supervisor marks such an attempt `Crashed`, submits the lane again
as a new task run (Ray places it on a live node; committed shards are skipped, staged rows kept) and
records the resubmission for the run summary. Ray's own task retries are off for lanes
(`max_retries=0`) so that every attempt is visible here and in the Prefect UI.
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from prefect.futures import PrefectFuture

from prefixflow.flows.lanes import LaneReport


@dataclass
class LaneOutcomes:
    """What the lanes did: reports of finished attempts, errors of lanes given up, resubmissions."""

    reports: list[LaneReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    resubmits: list[dict[str, Any]] = field(default_factory=list)


def supervise_lanes(
    submit: Callable[[int, int], PrefectFuture[LaneReport]],
    lanes: int,
    progress: Any,
    poll_s: float,
    resubmit_crashed: int,
    logger: Any,
) -> LaneOutcomes:
    """Submit lanes 0..lanes-1 with `submit(lane, attempt)`, wait for all, polling `progress`; a lane
    whose attempt crashed (its process died) is submitted again up to `resubmit_crashed` times."""
    outcome = LaneOutcomes()
    pending: dict[PrefectFuture[LaneReport], tuple[int, int]] = {submit(i, 1): (i, 1) for i in range(lanes)}
    while pending:
        done = wait_for_any(pending, poll_s)
        progress.poll()
        for future in done:
            lane, attempt = pending.pop(future)
            result, state = _settle(future)
            if isinstance(result, LaneReport):
                result.attempt = attempt
                outcome.reports.append(result)
                continue
            message = f"{state.name if state else 'Crashed'}: {(state.message if state else None) or result}"
            if state is not None and state.is_crashed() and attempt <= resubmit_crashed:
                _mark_crashed(future, message)
                outcome.resubmits.append({"lane": lane, "attempt": attempt, "error": message})
                logger.warning("lane %d attempt %d crashed (%s); resubmitting it", lane, attempt, message)
                pending[submit(lane, attempt + 1)] = (lane, attempt + 1)
            else:
                outcome.errors.append(f"lane {lane}: {message}")
    return outcome


def wait_for_any(futures: Iterable[PrefectFuture[Any]], timeout_s: float, tick_s: float = 0.05) -> list[Any]:
    """The futures that have finished, waiting up to `timeout_s` for the first one.

    Polls without blocking instead of calling `prefect.futures.wait(timeout=...)`: that one arms a
    timer that interrupts the main thread, and an interrupt that lands while its waiter holds the
    event's lock leaves the lock held, so a later lane's done-callback blocks forever in the
    executor's thread and the flow cannot exit (seen under load: a 300 s test timeout, then a
    process that never ends)."""
    futures = list(futures)
    deadline = time.monotonic() + timeout_s
    while True:
        done = [f for f in futures if _finished(f)]
        if done or time.monotonic() >= deadline:
            return done
        time.sleep(min(tick_s, max(0.0, deadline - time.monotonic())))


def _finished(future: PrefectFuture[Any]) -> bool:
    """Whether a lane's attempt has ended, asked without blocking of any task runner's future."""
    wrapped = getattr(future, "wrapped_future", None)
    if isinstance(wrapped, concurrent.futures.Future):
        return wrapped.done()
    if type(wrapped).__name__ == "ObjectRef":  # prefect-ray: a Ray object reference
        import ray

        ready, _ = ray.wait([wrapped], timeout=0)
        return bool(ready)
    future.wait(timeout=0)
    return future.state.is_final()


def _settle(future: PrefectFuture[LaneReport]) -> tuple[Any, Any]:
    """(result or exception, final state) of a finished future; a Ray future whose task died turns
    into a local `Crashed` state in `wait()` (its `result()` would raise the Ray error instead)."""
    future.wait(timeout=0)
    try:
        result = future.result(raise_on_failure=False)
    except Exception as exc:  # noqa: BLE001 - any failure of the attempt is reported, not raised
        result = exc
    try:
        state = future.state
    except Exception:  # noqa: BLE001 - the API may not know an attempt whose process died at once
        state = None
    return result, state


def _mark_crashed(future: PrefectFuture[LaneReport], message: str) -> None:
    """Set the dead attempt's task run `Crashed` in the API (it would stay `Running` forever)."""
    from prefect import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_state(future.task_run_id, Crashed(message=message[:2000]), force=True)
    except Exception:  # noqa: BLE001 - the resubmission matters, the bookkeeping is best effort
        pass
