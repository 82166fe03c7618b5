"""A flow lane whose engine is tensor-parallel (2 CPU ranks over gloo), under a real Prefect server."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.flows.support import JOB, SHARD_ROWS, assert_exactly_once, delete_limit, requires_pipeline

pytestmark = [requires_pipeline, pytest.mark.timeout(600), pytest.mark.slow]


def test_a_tensor_parallel_lane_runs_every_shard_once(
    prefect_server: str, dataset: tuple[Path, list[str]], tmp_path: Path
):
    from prefixflow.flows import batch_inference

    inp, ids = dataset
    out = tmp_path / "out"
    delete_limit("prefixflow-cpu")
    state = batch_inference(
        input=str(inp),
        output=str(out),
        model="tiny",
        job=JOB,
        shard_rows=SHARD_ROWS,
        tensor_parallel_size=2,
        retry_delay_s=0.0,
        progress_poll_s=0.5,
        return_state=True,
    )
    assert state.is_completed(), state.message
    assert_exactly_once(out, ids)
    (lane,) = state.result()["lanes"]  # no GPUs: one lane, holding the CPU, its engine on two ranks
    assert lane["devices"] == ["prefixflow-cpu"]
