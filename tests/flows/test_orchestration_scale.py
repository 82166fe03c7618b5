"""Issue 25 item 4: orchestration stays O(lanes) in Prefect task runs and log records, and a shard costs the
storage only its own round trips, through the benchmark's instrumentation (benchmarks/orchestration_scale.py
measures the same at 10,000 shards). Counts only, never time.

150 one-row shards of ONE input file, 4 thread lanes, `--model tiny`, max_tokens 1. Each bound below fails
on the code before issue 25's fixes: 150+ log records (a line per shard), 150 marker reads in finalize (the
lanes' markers were read again), ~150 reads of the input (the whole file for every shard).
"""

from __future__ import annotations

from typing import Any

import pytest

from benchmarks.orchestration_scale import run_flow, write_input
from tests.flows.support import requires_pipeline

pytestmark = [requires_pipeline, pytest.mark.timeout(600)]
SHARDS, LANES = 150, 4


@pytest.fixture(scope="module")
def counts(prefect_server: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("scale")
    (root / "in").mkdir()
    write_input(str(root / "in"), SHARDS)
    # progress polls only when a lane finishes (poll_s is long), so counts do not depend on timing
    result = run_flow(str(root / "in"), str(root / "out"), SHARDS, LANES, None, poll_s=600.0)
    assert result["complete"] is True
    return result


def _calls(result: dict[str, Any]) -> dict[str, int]:
    calls: dict[str, int] = result["storage_calls_all"]
    return calls


def test_prefect_task_runs_and_log_records_are_o_lanes(counts: dict[str, Any]) -> None:
    # plan + one task per lane + summary, whatever the shard count
    assert counts["task_runs"] == LANES + 2
    # no log record per shard: the lanes log their start, heartbeat and end (each ~a handful)
    assert counts["log_records"] <= 12 * LANES, counts["log_records"]
    assert counts["artifacts"] <= 6 and counts["api_requests"] <= 60, counts["api_requests_top"]


def test_a_shard_costs_its_own_round_trips_and_nothing_per_shard_else(counts: dict[str, Any]) -> None:
    calls = _calls(counts)
    # the shard's own: write its part, create its marker, copy the part into data/
    for key in ("write _staging", "create _commits", "copy data"):
        assert calls.get(key) == SHARDS, (key, calls)
    # everything else is bounded by the lanes and the run, not the shards: the flow's finalize takes the
    # lanes' markers (no read per shard), and a lane reads the input file once (its rows stay decoded)
    assert calls.get("read _commits", 0) <= LANES, calls
    assert calls.get("read input", 0) <= 3 * LANES + 10, calls
    assert counts["storage_calls"] <= 3 * SHARDS + 150, counts["storage_calls_by_kind"]
    assert counts["storage_calls_by_kind"].get("list", 0) <= 60, counts["storage_calls_by_kind"]
