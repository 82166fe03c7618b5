"""The same flow with its lanes as Ray tasks on a local, CPU-only Ray instance."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flows.support import (
    JOB,
    NUM_SHARDS,
    SHARD_ROWS,
    assert_exactly_once,
    env_with_repo_on_path,
    read_lane_runs,
    requires_pipeline,
)

pytestmark = [
    requires_pipeline,
    pytest.mark.timeout(600),
]  # a Prefect server and a Ray instance start on a shared host


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A 2-CPU local Ray instance whose workers can import this repository."""
    ray = pytest.importorskip("ray")
    pytest.importorskip("prefect_ray")
    env = env_with_repo_on_path()
    # address="local": a new in-process instance, never a cluster that `ray start` left on this machine
    ray.init(
        address="local",
        num_cpus=2,
        num_gpus=0,
        include_dashboard=False,
        log_to_driver=True,
        runtime_env={"env_vars": {"PYTHONPATH": env["PYTHONPATH"]}},
    )
    yield
    ray.shutdown()


def test_ray_lanes_exactly_once(
    prefect_server: str, local_ray: None, dataset: tuple[Path, list[str]], tmp_path: Path
):
    import ray

    from prefixflow.flows import batch_inference

    inp, ids = dataset
    out = tmp_path / "out"
    state = batch_inference(
        input=str(inp),
        output=str(out),
        model="tiny",
        job=JOB,
        shard_rows=SHARD_ROWS,
        lanes=2,
        ray_address="auto",
        retry_delay_s=0.0,
        progress_poll_s=0.5,
        return_state=True,
    )
    assert state.is_completed(), state.message
    assert_exactly_once(out, ids)
    result = state.result()
    assert result["complete"] is True and result["run_shards_generated"] == NUM_SHARDS
    # Ray's num_gpus scheduling keeps Ray lanes apart; they take no per-device Prefect limits.
    assert all(lane["devices"] == [] and lane["gpus"] == [] for lane in result["lanes"])
    lanes = asyncio.run(read_lane_runs(state.state_details.flow_run_id))
    assert [r.name for r in lanes] == ["lane-0", "lane-1"] and all(r.state.is_completed() for r in lanes)
    assert ray.is_initialized()  # the flow used the existing instance and left it running
