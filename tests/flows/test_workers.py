"""Prefect deployments run by Prefect workers, against a real `prefect server start` (issue 25, item 3).

A process work pool, two `prefect worker start --pool` processes (one flow run at a time each), and
deployments registered by `prefixflow serve --work-pool` from this checkout: each run is pulled by a
worker and executed in a subprocess of it; the output equals a local run's, each row exactly once."""

from __future__ import annotations

import asyncio
import json
import signal
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from prefixflow.pipeline import load_job
from prefixflow.pipeline.local_run import run_local
from tests.flows.prefect_server import PrefectServer
from tests.flows.support import (
    JOB,
    SHARD_ROWS,
    assert_exactly_once,
    committed_table,
    requires_pipeline,
    write_dataset,
)

pytestmark = [requires_pipeline, pytest.mark.slow]
COMPARED = ["id", "output", "finish_reason", "error_class", "prompt_tokens", "output_tokens", "row_index"]
POOL = "pf-workers"


# A job that decodes for ~12 s of engine time on this kind of host (20 rows, one at a time, 768 tokens
# each), so that the two runs overlap by far more than a worker's pickup and subprocess start (the short
# default job ran ~3 s, and once ended before the second run, scheduled 2 s later, had started).
LONG_JOB: dict[str, Any] = {
    **JOB,
    "sampling": {"max_tokens": 768, "min_tokens": 768, "temperature": 0.0},
    "engine": {**JOB["engine"], "max_model_len": 1024, "max_num_seqs": 1},
}


def rows(out: Path) -> pa.Table:
    return committed_table(out).select(COMPARED).sort_by("id")


def local_reference(inp: Path, out: Path, job: dict[str, Any]) -> pa.Table:
    """The same job run by `run_local` in this process: what a worker's run must equal."""
    summary, failures = run_local(
        load_job(str(inp), str(out), "tiny", job, shard_rows=SHARD_ROWS), progress=False
    )
    assert summary.complete and not failures
    return rows(out)


def create_pool(server: PrefectServer, name: str) -> str:
    """A process work pool (what `prefect work-pool create NAME --type process` makes), through this
    process's client: a `prefect` CLI process costs 5-15 s of imports on a loaded host."""
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with server.api(), get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name=name, type="process"))
    return name


@pytest.fixture(scope="module")
def pool(real_prefect_server: PrefectServer) -> str:
    """The process work pool and its two workers (each runs one flow run at a time)."""
    create_pool(real_prefect_server, POOL)
    for name in ("worker-a", "worker-b"):
        real_prefect_server.start_worker(POOL, name, limit=1)
    return POOL


def register(
    server: PrefectServer, name: str, inp: Path, out: Path, job_file: Path, *extra: str, pool: str = POOL
) -> None:
    """`prefixflow serve --work-pool` (a subprocess, as a user types it)."""
    done = server.cli(
        "prefixflow",
        "serve",
        "--work-pool",
        pool,
        "--name",
        name,
        "--input",
        str(inp),
        "--output",
        str(out),
        "--model",
        "tiny",
        "--job",
        str(job_file),
        "--shard-rows",
        str(SHARD_ROWS),
        "--lanes",
        "1",
        "--retry-delay",
        "0",
        *extra,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"registered deployment batch-inference/{name}" in done.stdout


def register_all(
    server: PrefectServer, deployments: list[tuple[str, Path, Path, Path]], pool: str = POOL
) -> None:
    """`register` each (name, input, output, job file), the CLI processes side by side (each spends most of
    its time importing)."""
    with ThreadPoolExecutor(len(deployments)) as workers:
        done = [
            workers.submit(register, server, name, inp, out, job, "--concurrency-limit", "none", pool=pool)
            for name, inp, out, job in deployments
        ]
        for future in done:
            future.result()


def trigger(server: PrefectServer, name: str, start_in_s: float = 0) -> str:
    """An ad-hoc run of the deployment, or a scheduled one due in `start_in_s` (what `prefect deployment
    run NAME [--start-in ...]` does, through this process's client); returns the flow run id."""
    from prefect.deployments import run_deployment

    when = datetime.now(UTC) + timedelta(seconds=start_in_s) if start_in_s else None
    with server.api():
        run = run_deployment(f"batch-inference/{name}", timeout=0, scheduled_time=when, as_subflow=False)
    return str(run.id)


async def read_run(server: PrefectServer, run_id: str) -> Any:
    from prefect import get_client

    with server.api():
        async with get_client() as client:
            return await client.read_flow_run(uuid.UUID(run_id))


def wait_final(server: PrefectServer, run_id: str, timeout_s: float = 420) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        run = asyncio.run(read_run(server, run_id))
        if run.state is not None and run.state.is_final():
            return run
        if time.monotonic() > deadline:
            raise AssertionError(
                f"flow run {run_id} not final after {timeout_s}s: {run.state!r}\n{worker_logs(server)}"
            )
        time.sleep(1)


def worker_logs(server: PrefectServer) -> str:
    return "\n".join(f"--- {w.name}\n{w.text()[-3000:]}" for w in server.workers)


def which_worker(run: Any) -> str:
    """The worker that ran the flow run (the label the worker gives each run it submits)."""
    return str(run.labels.get("prefect.worker.name"))


def write_job(path: Path, job: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(job))
    return path


@pytest.mark.timeout(900)
def test_two_workers_run_two_jobs_concurrently_each_exactly_once_equal_to_local(
    real_prefect_server: PrefectServer, pool: str, tmp_path: Path
) -> None:
    server = real_prefect_server
    ids = write_dataset(tmp_path / "in")
    jobs = {"a": LONG_JOB, "b": {**JOB, "sampling": {"max_tokens": 2, "temperature": 0.0}}}
    runs = {}
    register_all(
        server,
        [
            (
                f"job-{name}",
                tmp_path / "in",
                tmp_path / f"out-{name}",
                write_job(tmp_path / f"{name}.yaml", job),
            )
            for name, job in jobs.items()
        ],
    )
    runs["a"] = trigger(server, "job-a")  # ad hoc
    runs["b"] = trigger(server, "job-b", start_in_s=2)  # scheduled, picked up when due
    done = {name: wait_final(server, run_id) for name, run_id in runs.items()}
    for name, run in done.items():
        assert run.state.is_completed(), f"{name}: {run.state!r}\n{worker_logs(server)}"
        assert run.work_pool_name == POOL
    placed = {name: which_worker(run) for name, run in done.items()}
    assert sorted(placed.values()) == ["worker-a", "worker-b"], placed  # one run on each worker
    a, b = done["a"], done["b"]
    assert a.start_time < b.end_time and b.start_time < a.end_time, (
        f"the two runs did not overlap: a {a.start_time}..{a.end_time}, b {b.start_time}..{b.end_time}"
    )
    for name, job in jobs.items():
        assert_exactly_once(tmp_path / f"out-{name}", ids)
        assert rows(tmp_path / f"out-{name}").equals(
            local_reference(tmp_path / "in", tmp_path / f"ref-{name}", job)
        )
    summary = json.loads((tmp_path / "out-a" / "_manifest.json").read_text())
    assert summary["complete"] and summary["rows"] == len(ids)


def deployment_slots(server: PrefectServer, name: str) -> int:
    """Slots of the deployment's concurrency limit (`prefixflow serve --work-pool` sets 1) now held."""
    from prefect import get_client

    with server.api(), get_client(sync_client=True) as client:
        limit = client.read_deployment_by_name(f"batch-inference/{name}").global_concurrency_limit
    assert limit is not None and limit.limit == 1, limit
    return int(limit.active_slots)


def markers(out: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted((out / "_commits").rglob("*.json"))}


def wait_for_commits(out: Path, n: int, timeout_s: float = 420) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while len(found := markers(out)) < n:
        assert time.monotonic() < deadline, f"fewer than {n} shards committed in {out} after {timeout_s}s"
        time.sleep(0.1)
    return found


@pytest.mark.timeout(900)
def test_a_second_run_of_the_job_is_refused_and_a_killed_workers_run_is_crashed_then_resumed_once(
    real_prefect_server: PrefectServer, tmp_path: Path
) -> None:
    """Items 3 and 4: two deployments of one job into one output (a scheduled one and a manual one, say).
    While the first run writes, the second is refused by the output's driver lease, naming the first. Then
    the worker running the first is SIGKILLed with its process tree after a shard committed: the next run
    marks it Crashed in the API and resumes, committed shards kept as they were, every row exactly once."""
    server = real_prefect_server
    pool = "pf-kill"
    create_pool(server, pool)
    # each shard pauses 2 s after its commit, so the first run is caught mid-run; leases outlive the pause
    slow = {
        "PREFIXFLOW_TEST_HOOKS": "commit_end",
        "PREFIXFLOW_TEST_HOOK_SLEEP": "2",
        "PREFIXFLOW_LEASE_TTL_S": "900",
    }
    workers = [server.start_worker(pool, f"kill-{x}", limit=1, env=slow) for x in "ab"]
    ids = write_dataset(tmp_path / "in")
    out, job_file = tmp_path / "out", write_job(tmp_path / "job.yaml", JOB)
    register_all(
        server, [(name, tmp_path / "in", out, job_file) for name in ("nightly", "manual")], pool=pool
    )
    first = trigger(server, "nightly")
    while (picked := which_worker(asyncio.run(read_run(server, first)))) == "None":
        time.sleep(0.5)
    owner = [w for w in workers if w.name == picked]
    assert len(owner) == 1, (picked, worker_logs(server))
    wait_for_commits(out, 1)
    owner[0].kill_tree(
        signal.SIGSTOP
    )  # the first run stays mid-run (alive, its lease live) while the second tries
    running = asyncio.run(read_run(server, first))
    before = markers(out)
    assert running.state.is_running() and 1 <= len(before) < 5, (running.state, before)
    refused = wait_final(server, trigger(server, "manual"))
    message = refused.state.message or ""
    assert refused.state.is_failed(), refused.state
    assert "already being written by another run" in message and first in message, message
    assert which_worker(refused) != owner[0].name
    owner[0].kill_tree()  # SIGKILL the worker and the flow run's process tree
    owner[0].proc.wait(timeout=30)
    assert deployment_slots(server, "nightly") == 1  # the dead run still holds its deployment's slot
    resumed = wait_final(server, trigger(server, "manual"))
    assert resumed.state.is_completed(), f"{resumed.state!r}\n{worker_logs(server)}"
    crashed = asyncio.run(read_run(server, first))
    assert crashed.state.is_crashed(), crashed.state
    # marking it Crashed released that slot at once (Prefect's ReleaseFlowConcurrencySlots), not after the
    # 300 s lease: the next run of "nightly" is not held in AwaitingConcurrencySlot
    assert deployment_slots(server, "nightly") == 0
    after = markers(out)
    assert {k: after[k] for k in before} == before  # committed shards were not generated again
    assert_exactly_once(out, ids)
    assert rows(out).equals(local_reference(tmp_path / "in", tmp_path / "ref", JOB))
