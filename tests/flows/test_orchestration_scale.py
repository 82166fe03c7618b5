"""Issue 25 item 4: orchestration stays O(lanes) in Prefect task runs and log records, and a shard costs the
storage only its own round trips, through the benchmark's instrumentation (benchmarks/orchestration_scale.py
measures the same at 10,000 shards). Counts only, never time.

150 one-row shards of ONE input file, 4 thread lanes, `--model tiny`, max_tokens 1. Each bound below fails
on the code before issue 25's fixes: 150+ log records (a line per shard), 150 marker reads in finalize (the
lanes' markers were read again), ~150 reads of the input (the whole file for every shard).
"""

from __future__ import annotations

from pathlib import Path
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
    # the shard's own (publish: direct, one part): create its part in data/, create its marker; no
    # staging, no copy
    for key in ("create data", "create _commits"):
        assert calls.get(key) == SHARDS, (key, calls)
    assert calls.get("write _staging", 0) == calls.get("copy data", 0) == 0, calls
    # everything else is bounded by the lanes and the run, not the shards: the flow's finalize takes the
    # lanes' markers (no read per shard), and a lane reads the input file once (its rows stay decoded)
    assert calls.get("read _commits", 0) <= LANES, calls
    assert calls.get("read input", 0) <= 3 * LANES + 10, calls
    assert counts["storage_calls"] <= 2 * SHARDS + 150, counts["storage_calls_by_kind"]  # copy: >= 3 x SHARDS
    assert counts["storage_calls_by_kind"].get("list", 0) <= 60, counts["storage_calls_by_kind"]


def test_progress_lists_the_markers_at_most_about_every_committed_over_1000_seconds(
    prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A progress poll lists every marker of the run; polling every 2 s would make a long run's listings
    O(shards x duration). With 3,000 shards committed the flow lists again only after ~3 s."""
    from prefixflow.flows import reporting
    from prefixflow.pipeline import Shard, load_job, prepare_run

    (tmp_path / "in").mkdir()
    write_input(str(tmp_path / "in"), 4)
    run = prepare_run(
        load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", {"prompt_column": "prompt"})
    )
    shards = [Shard(f"s{i:05d}", "in/data.parquet", i, i + 1, 1) for i in range(3000)]
    commits = Path(run.layout.commits)
    commits.mkdir(parents=True, exist_ok=True)
    for shard in shards:  # committed (a listing reads only the names)
        (commits / f"{shard.shard_id}.json").write_text("{}")
    now = [1000.0]
    monkeypatch.setattr(reporting.time, "monotonic", lambda: now[0])
    listings = []
    refresh = run.refresh_commits
    monkeypatch.setattr(run, "refresh_commits", lambda: (listings.append(now[0]), refresh())[1])
    progress = reporting.ShardProgress(run, [shards[:1500], shards[1500:]])
    assert progress.done == 3000 and listings == [1000.0]
    for t in (1000.5, 1001.0, 1002.5):
        now[0] = t
        assert progress.poll() == 3000
    assert listings == [1000.0]  # not due before 1000 + 3000 / 1000
    now[0] = 1003.1
    progress.poll()
    assert listings == [1000.0, 1003.1]
