"""Orchestration stays O(lanes) in Prefect tasks and O(shards) in storage operations (no per-shard
listing of everything): the flow's counts at 6 and 12 one-row shards, through the benchmark's
instrumentation (benchmarks/orchestration_scale.py, which measures the same at 10,000 shards)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.orchestration_scale import run_flow, write_input
from tests.flows.support import requires_pipeline

pytestmark = [requires_pipeline, pytest.mark.timeout(600)]
LANES = 2
# Storage calls per extra shard: 21.5 measured after one listing replaced the per-shard marker reads of
# the lane's skip check and the run's final count (31.5 before, read_bytes 13 -> 6.3 per shard); 26 on
# the main of 22:25 UTC (later pipeline checks), where the old per-shard reads would add 9 more.
PER_SHARD_OPS = 30
PER_SHARD_READS = 11


def _counts(tmp_path: Path, shards: int) -> dict[str, Any]:
    inp = tmp_path / f"in-{shards}"
    inp.mkdir()
    write_input(str(inp), shards)
    # progress polls only when a lane finishes (poll_s is long), so counts do not depend on timing
    result = run_flow(str(inp), str(tmp_path / f"out-{shards}"), shards, LANES, None, poll_s=600.0)
    assert result["complete"] is True
    return result


def test_task_count_flat_and_storage_ops_linear_in_shards(prefect_server: str, tmp_path: Path):
    small, large = _counts(tmp_path, 6), _counts(tmp_path, 12)
    # plan + one task per lane + summary, whatever the shard count
    assert small["task_runs"] == large["task_runs"] == LANES + 2
    # each extra shard costs a bounded number of storage calls, and listings do not grow with the
    # number of shards already committed (a per-shard listing of all markers would be O(shards^2))
    extra = {op: large["store_ops"].get(op, 0) - small["store_ops"].get(op, 0) for op in large["store_ops"]}
    listed = extra.pop("listed_entries", 0)
    assert sum(extra.values()) <= 6 * PER_SHARD_OPS, extra
    assert extra.get("list_files", 0) <= 6 * 3 and extra.get("list_dir", 0) <= 2, extra
    # entries returned by all listings: a listing of every marker per shard would add ~shards per shard
    assert listed <= 6 * 6, (listed, extra)
    assert extra.get("read_bytes", 0) <= 6 * PER_SHARD_READS, extra
