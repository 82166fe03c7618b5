"""The batch_inference flow on the local thread runner, under a real Prefect server."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pyarrow.compute as pc
import pytest

from tests.flows.support import (
    EMPTY_PROMPT_IDS,
    JOB,
    NUM_SHARDS,
    SHARD_ROWS,
    assert_exactly_once,
    assert_never_shared,
    delete_limit,
    hold_intervals,
    read_artifacts,
    read_lane_runs,
    read_limit,
    requires_pipeline,
)

pytestmark = [requires_pipeline, pytest.mark.timeout(300)]


def _run(inp: Path, out: Path, **kw: Any) -> Any:
    from prefixflow.flows import batch_inference

    params: dict[str, Any] = dict(lanes=2, retry_delay_s=0.0, progress_poll_s=0.5)
    params.update(kw)
    return batch_inference(
        input=str(inp),
        output=str(out),
        model="tiny",
        job=JOB,
        shard_rows=SHARD_ROWS,
        return_state=True,
        **params,
    )


def test_two_lanes_exactly_once_with_artifacts(
    prefect_server: str, dataset: tuple[Path, list[str]], tmp_path: Path
):
    inp, ids = dataset
    out = tmp_path / "out"
    delete_limit("prefixflow-cpu")  # the default device limit on a machine without GPUs
    state = _run(inp, out)
    assert state.is_completed(), state.message
    result = state.result()
    table = assert_exactly_once(out, ids)

    lanes = asyncio.run(read_lane_runs(state.state_details.flow_run_id))
    assert [r.name for r in lanes] == ["lane-0", "lane-1"]
    assert all(r.state.is_completed() and r.run_count == 1 for r in lanes)
    generated = [s for lane in result["lanes"] for s in lane["generated"]]
    assert len(generated) == len(set(generated)) == NUM_SHARDS  # every shard generated once, by one lane
    assert all(lane["generated"] for lane in result["lanes"])
    # The lanes created the missing CPU device limit, took turns on it and released it.
    assert all(lane["devices"] == ["prefixflow-cpu"] and lane["gpus"] == [] for lane in result["lanes"])
    assert_never_shared(hold_intervals(result["lanes"]))
    limit = read_limit("prefixflow-cpu")
    assert limit is not None and limit.limit == 1 and limit.active_slots == 0

    arts = asyncio.run(read_artifacts(state.state_details.flow_run_id))
    summary = {row["metric"]: row["value"] for row in json.loads(arts["prefixflow-run-summary"].data)}
    assert summary["rows"] == len(ids)
    assert summary["error_rows"] == len(EMPTY_PROMPT_IDS)
    assert sum(v for k, v in summary.items() if k.startswith("errors_by_class[")) == len(EMPTY_PROMPT_IDS)
    assert summary["output_tokens"] == summary["run_output_tokens"] > 0
    assert summary["output_tokens"] == pc.sum(table.column("output_tokens")).as_py()
    assert summary["prompt_tokens"] == pc.sum(table.column("prompt_tokens")).as_py()
    assert summary["cached_tokens"] == pc.sum(table.column("cached_tokens")).as_py()
    assert summary["complete"] is True and summary["shards_committed"] == NUM_SHARDS
    assert summary["run_shards_generated"] == NUM_SHARDS
    assert summary["run_tokens_per_s"] > 0 and summary["tokens_per_s"] > 0
    hit_rate = summary["cached_tokens"] / summary["prompt_tokens"]
    assert summary["prefix_hit_rate"] == pytest.approx(hit_rate, abs=1e-4)
    assert float(arts["prefixflow-progress"].data) == 100.0
    # usage for cost reports, and throughput over time per lane (stored beside the run record, drawn)
    assert summary["device_seconds"] > 0
    chart = arts["prefixflow-throughput"].data
    assert "| lane-0 |" in chart and "| lane-1 |" in chart and "data:image/svg+xml;base64," in chart
    assert len(list((out / "_metrics").glob("*/throughput/lane-*.json"))) == 2
    assert (out / "_throughput.svg").read_text().startswith("<svg")
    manifest = json.loads((out / "_manifest.json").read_text())
    assert (
        manifest["usage"]["output_tokens"] == summary["output_tokens"]
        and manifest["usage"]["device_seconds"] > 0
    )
    # what the advisor predicted when the run started, beside what the run measured (issue 18)
    compared = {row["metric"]: row for row in json.loads(arts["prefixflow-predicted-vs-measured"].data)}
    assert {"output tok/s per lane", "prefix hit rate", "preemptions", "device-hours, whole input"} <= set(
        compared
    )
    assert compared["prefix hit rate"]["measured"] == pytest.approx(hit_rate, abs=1e-4)
    assert compared["preemptions"]["measured"] == 0
    assert not any(
        k.startswith("predicted_vs_measured") for k in summary
    )  # its own artifact, not a summary row


def test_lane_failing_once_is_retried_without_regenerating(
    prefect_server: str, dataset: tuple[Path, list[str]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    inp, ids = dataset
    out, marker = tmp_path / "out", tmp_path / "fault-fired"
    monkeypatch.setenv("PREFIXFLOW_FAULT_ONCE", str(marker))
    state = _run(inp, out, lane_retries=2)
    assert state.is_completed(), state.message
    assert marker.exists(), "the injected fault never fired"
    assert_exactly_once(out, ids)

    lanes = asyncio.run(read_lane_runs(state.state_details.flow_run_id))
    assert sorted(r.run_count for r in lanes) == [1, 2]
    result = state.result()
    retried = [lane for lane in result["lanes"] if lane["already_committed"]]
    assert len(retried) == 1, result["lanes"]
    # The shard committed before the fault was skipped by the retry, not generated again.
    generated = [s for lane in result["lanes"] for s in lane["generated"]]
    assert not set(generated) & set(retried[0]["already_committed"])
    assert len(generated) + 1 == NUM_SHARDS == result["run_shards_generated"] + 1


def test_unreadable_shard_fails_flow_while_other_lanes_finish(
    prefect_server: str, dataset: tuple[Path, list[str]], tmp_path: Path
):
    inp, ids = dataset
    (inp / "c_corrupt.parquet").write_bytes(b"PAR1 this is not a parquet file")
    out = tmp_path / "out"
    state = _run(inp, out, lane_retries=1)
    assert state.is_failed()
    assert "c_corrupt" in state.message and "not committed" in state.message
    assert_exactly_once(out, ids)
    lanes = asyncio.run(read_lane_runs(state.state_details.flow_run_id))
    assert sorted(r.state.type.value for r in lanes) == ["COMPLETED", "FAILED"]
    failed = next(r for r in lanes if r.state.is_failed())
    assert failed.run_count == 2  # first attempt + one retry


def test_lane_timeout_fails_cleanly_and_a_rerun_resumes(
    prefect_server: str, dataset: tuple[Path, list[str]], tmp_path: Path
):
    inp, ids = dataset
    out = tmp_path / "out"
    state = _run(inp, out, lanes=1, lane_retries=0, lane_timeout_s=0.05)
    assert state.is_failed()
    assert "not committed" in state.message
    (lane,) = asyncio.run(read_lane_runs(state.state_details.flow_run_id))
    assert lane.state.name == "TimedOut" and "timeout" in state.message
    state = _run(inp, out, lanes=1)
    assert state.is_completed(), state.message
    assert_exactly_once(out, ids)
