"""The Run handle's safety (issue 23 item 1): it never re-reads the run record while this process's lease
proves nobody can have replaced the run, and does read it (and stops) when that proof is gone."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import prefixflow.pipeline.run.lease as lease
from prefixflow.pipeline import RunSuperseded, load_job, plan_shards, prepare_output, prepare_run, run_shard
from prefixflow.pipeline.run.record import hold_output
from prefixflow.pipeline.storage.layout import Layout
from tests.pipeline.support import ENGINE, write_parquet

JOB = {
    "task": "generate",
    "id_column": "id",
    "template": "Say {{ text }}",
    "engine": dict(ENGINE),
    "sampling": {"max_tokens": 1},
    "output": {"shard_rows": 1},
}


def _spec(tmp_path: Path):
    write_parquet(tmp_path / "in" / "a.parquet", [{"id": f"r{i}", "text": f"t {i}"} for i in range(2)], 1)
    return load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", JOB)


def _markers(out: Path, run_id: str) -> list[str]:
    return sorted(p.name for p in (out / "_commits" / run_id).glob("*.json"))


def test_a_new_run_in_this_process_stops_an_open_run_before_it_commits(tmp_path: Path, tiny_llm) -> None:
    spec = _spec(tmp_path)
    shards = plan_shards(spec)
    with hold_output(spec):
        run = prepare_run(spec, shards=shards)
        assert lease.held(run.root).covers(run.verified_at)  # commits need no read of the record
        run_shard(run, shards[0], tiny_llm)
        new = prepare_output(spec, new_run=True)  # the same lease object, taken exclusively
        with pytest.raises(RunSuperseded, match=f"taken over by another run \\({new.run_id}\\)"):
            run_shard(run, shards[1], tiny_llm)
    assert _markers(tmp_path / "out", run.run_id) == []  # the old run's folders were swept, nothing added
    assert not (tmp_path / "out" / "data" / run.run_id).exists()  # not even a direct part (publish: direct)


def test_a_lapsed_lease_makes_the_commit_read_the_record(tmp_path: Path, tiny_llm, monkeypatch) -> None:
    """A writer whose renewals stalled past the TTL (a paused process, a slow store) may have been
    replaced by a --new-run elsewhere, which then saw its lease expired: it reads the record and stops."""
    monkeypatch.setattr(lease, "LEASE_TTL_S", 2.5)
    monkeypatch.setattr(lease.OutputLease, "_renew", lambda self: None)  # renewals stall
    spec = _spec(tmp_path)
    shards = plan_shards(spec)
    with hold_output(spec):
        run = prepare_run(spec, shards=shards)
        held = lease.held(run.root)
        import time

        time.sleep(3.0)  # past the TTL: every reader now takes this lease for expired
        assert not held.covers(run.verified_at)
        root = Layout(run.store)
        other = lease.OutputLease(root)  # another process's --new-run: it sees no live writer
        with other.exclusive():
            root.store.write_atomic(
                root.record, replace(run.record, run_id="20990101T000000-other").to_json()
            )
        other.release()
        with pytest.raises(RunSuperseded, match="20990101T000000-other"):
            run_shard(run, shards[0], tiny_llm)
    assert _markers(tmp_path / "out", run.run_id) == []
    assert not (tmp_path / "out" / "data").exists()  # the direct part is checked before it is written
    assert (
        json.loads((tmp_path / "out" / "_prefixflow.json").read_text())["run_id"] == "20990101T000000-other"
    )
