"""Two flows at once on one machine never put two lanes on the same device (real Prefect)."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from tests.flows.support import (
    JOB,
    SHARD_ROWS,
    assert_exactly_once,
    assert_never_shared,
    hold_intervals,
    read_limit,
    requires_pipeline,
)

pytestmark = [requires_pipeline, pytest.mark.timeout(300)]

# The lanes load the engine on the CPU whatever devices they believe they hold.
CPU_JOB: dict[str, Any] = {**JOB, "engine": {**JOB["engine"], "device": "cpu"}}


@pytest.mark.parametrize(
    ("visible", "limits"),
    [("0,1", ["pf2-gpu-0", "pf2-gpu-1"]), ("", ["pf2-cpu"])],
    ids=["two-gpus", "cpu"],
)
def test_two_concurrent_flows_never_share_a_device(
    prefect_server: str,
    dataset: tuple[Path, list[str]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    visible: str,
    limits: list[str],
):
    """Each flow has 2 lanes; with 2 (simulated) GPUs the first lanes of both flows compete for
    GPU 0, so without per-device limits two lanes would run on it at once."""
    from prefixflow.flows import batch_inference

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    pinned: list[int] = []
    monkeypatch.setattr("prefixflow.flows.lanes.pin_thread_to_gpu", pinned.append)
    inp, ids = dataset

    def run(out: Path) -> Any:
        return batch_inference(
            input=str(inp),
            output=str(out),
            model="tiny",
            job=CPU_JOB,
            shard_rows=SHARD_ROWS,
            lanes=2,
            concurrency_limit="pf2",
            retry_delay_s=0.0,
            progress_poll_s=0.5,
            return_state=True,
        )

    outs = [tmp_path / "out-a", tmp_path / "out-b"]
    with ThreadPoolExecutor(2) as pool:
        states = list(pool.map(run, outs))
    lanes = []
    for state, out in zip(states, outs):
        assert state.is_completed(), state.message
        assert_exactly_once(out, ids)
        lanes += state.result()["lanes"]

    assert len(lanes) == 4 and all(len(lane["devices"]) == 1 for lane in lanes)
    spans = hold_intervals(lanes)
    assert sorted(spans) == limits  # with two GPUs, both are used
    assert_never_shared(spans)
    # A lane runs on the GPU whose limit it holds.
    for lane in lanes:
        assert [f"pf2-gpu-{g}" for g in lane["gpus"]] == (lane["devices"] if lane["gpus"] else [])
    assert sorted(pinned) == sorted(g for lane in lanes for g in lane["gpus"])
    assert all(read_limit(name).active_slots == 0 for name in limits)
