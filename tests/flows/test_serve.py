"""`prefixflow serve`: a deployment with the requested schedule, registered through a real server."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.flows.support import (
    JOB,
    REPO,
    SHARD_ROWS,
    assert_exactly_once,
    env_with_repo_on_path,
    requires_pipeline,
    write_dataset,
)

pytestmark = [requires_pipeline, pytest.mark.timeout(240)]


async def _deployment(name: str) -> Any | None:
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    async with get_client() as client:
        try:
            return await client.read_deployment_by_name(f"batch-inference/{name}")
        except ObjectNotFound:
            return None


async def _run_deployment_and_wait(deployment_id: Any, timeout_s: float) -> Any:
    from prefect import get_client

    async with get_client() as client:
        run = await client.create_flow_run_from_deployment(deployment_id)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            run = await client.read_flow_run(run.id)
            if run.state is not None and run.state.is_final():
                break
            await asyncio.sleep(1)
        return run


def test_serve_registers_cron_deployment_runs_it_and_stops_on_sigterm(prefect_server: str, tmp_path: Path):
    ids = write_dataset(tmp_path / "in")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(JOB))
    env = env_with_repo_on_path()
    env.update(PREFECT_API_URL=prefect_server, PREFECT_RUNNER_POLL_FREQUENCY="1")
    argv = [
        "serve",
        "--name",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--input",
        str(tmp_path / "in"),
        "--output",
        str(tmp_path / "out"),
        "--model",
        "tiny",
        "--job",
        str(job),
        "--shard-rows",
        str(SHARD_ROWS),
        "--lanes",
        "2",
        "--max-tokens",
        "4",
        "--retry-delay",
        "0",
    ]
    cmd = [sys.executable, "-c", "import sys; from prefixflow.flows.cli import main; sys.exit(main())", *argv]
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        deployment = None
        deadline = time.monotonic() + 120
        while deployment is None and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(1)
            deployment = asyncio.run(_deployment("nightly"))
        assert deployment is not None, f"no deployment registered; serve said:\n{_drain(proc)}"
        assert [s.schedule.cron for s in deployment.schedules] == ["0 3 * * *"]
        assert deployment.entrypoint == "prefixflow.flows.flow.batch_inference"
        assert deployment.parameters["lanes"] == 2 and deployment.parameters["model"] == "tiny"
        assert deployment.parameters["max_tokens"] == 4
        assert proc.poll() is None, "serve exited while it should be serving"
        run = asyncio.run(_run_deployment_and_wait(deployment.id, timeout_s=120))
        assert run.state.is_completed(), f"{run.state!r}\n{_drain(proc)}"
        assert_exactly_once(tmp_path / "out", ids)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, _drain(proc)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _drain(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.kill()
    return proc.communicate()[0][-4000:]


def test_work_pool_deployment_with_interval(prefect_server: str, tmp_path: Path):
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    from prefixflow.flows.cli import serve_main

    async def make_pool() -> None:
        async with get_client() as client:
            await client.create_work_pool(WorkPoolCreate(name="pf-test-pool", type="process"))

    asyncio.run(make_pool())
    argv = [
        "--name",
        "hourly",
        "--interval",
        "3600",
        "--work-pool",
        "pf-test-pool",
        "--input",
        str(tmp_path),
        "--output",
        str(tmp_path / "out"),
        "--model",
        "tiny",
        "--concurrency-limit",
        "none",
    ]
    assert serve_main(argv) == 0
    deployment = asyncio.run(_deployment("hourly"))
    assert deployment is not None and deployment.work_pool_name == "pf-test-pool"
    assert [s.schedule.interval for s in deployment.schedules] == [timedelta(hours=1)]
    assert deployment.parameters["concurrency_limit"] is None
    assert deployment.entrypoint == "flows/flow.py:batch_inference"
