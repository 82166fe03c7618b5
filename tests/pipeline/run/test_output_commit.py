"""Output root bookkeeping without a model: exclusive create, fingerprints, staging, commit, publish."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from prefixflow.pipeline import (
    FingerprintMismatch,
    OutputNotPrepared,
    finalize,
    load_job,
    open_run,
    plan_shards,
    prepare_output,
    prepare_run,
)
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.run import commit as commits
from prefixflow.pipeline.run.record import output_layout
from prefixflow.pipeline.storage.layout import Layout
from prefixflow.pipeline.storage.store import Store
from prefixflow.pipeline.tasks.output_schema import base_record, encode_part, output_schema
from tests.pipeline.support import job, write_dataset


def test_local_exclusive_create_has_one_winner(tmp_path: Path) -> None:
    store = Store.open(str(tmp_path), StorageConfig())
    target = store.join("m.json")
    wins: list[bool] = []
    threads = [
        threading.Thread(target=lambda i=i: wins.append(store.create_exclusive(target, str(i).encode())))
        for i in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(wins) == [False] * 7 + [True]
    assert store.read_bytes(target) in {str(i).encode() for i in range(8)}
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def _spec(tmp_path: Path, **kw):
    write_dataset(tmp_path / "in")
    return load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("summarize", **kw))


def test_fingerprint_mismatch_is_refused_and_new_run_resets(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    prepare_output(spec)
    prepare_output(spec)  # same job: fine (resume)
    changed = load_job(spec.input, spec.output, "tiny", job("summarize", sampling={"max_tokens": 9}))
    with pytest.raises(FingerprintMismatch) as info:
        prepare_output(changed)
    assert "max_tokens" in str(info.value) and "--new-run" in str(info.value)
    with pytest.raises(FingerprintMismatch):
        open_run(changed)
    first = json.loads((tmp_path / "out" / "_prefixflow.json").read_text())["run_id"]
    (tmp_path / "out" / "data" / first / "x").mkdir(parents=True)
    prepare_output(changed, new_run=True)
    assert not (tmp_path / "out" / "data" / first).exists()
    record = json.loads((tmp_path / "out" / "_prefixflow.json").read_text())
    assert record["fingerprint_hash"] == changed.fingerprint_hash()
    assert record["run_id"] != first and record["retired_runs"] == [first]


def test_new_run_always_starts_over_also_for_the_same_job(tmp_path: Path) -> None:
    """Issue 22 item 1: --new-run is the documented remedy for a changed input, whose fingerprint is the
    same; so it starts over even when the job did not change (it used to resume)."""
    spec = _spec(tmp_path)
    run_id = prepare_output(spec).run_id
    marker = tmp_path / "out" / "_commits" / run_id / "done.json"
    marker.parent.mkdir(parents=True)
    marker.write_text("{}")
    assert prepare_output(spec).run_id == run_id and marker.exists()  # a plain rerun resumes
    new = prepare_output(spec, new_run=True)
    assert new.run_id != run_id and run_id in new.retired_runs
    assert not marker.exists()


def test_run_shard_requires_prepared_output(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    with pytest.raises(OutputNotPrepared, match="prepare_output"):
        open_run(spec)


def _part(spec, keys: list[int]) -> bytes:
    schema = output_schema(spec.config, spec.task)
    return encode_part([base_record(k, f"id{k}", "f.parquet", {}) | {"output": "x"} for k in keys], schema)


def test_overlapping_staged_attempts_keep_each_row_once(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    layout = output_layout(spec).for_run(prepare_output(spec).run_id)
    commits.write_part(layout, "s1", "a1", 0, _part(spec, [0, 1, 2]))
    commits.write_part(layout, "s1", "a1", 1, _part(spec, [3]))
    commits.write_part(layout, "s1", "a2", 0, _part(spec, [2, 4]))  # a concurrent attempt overlapping row 2
    commits.write_part(layout, "s1", "a2", 1, _part(spec, [5]))
    (tmp_path / "out" / "_staging" / layout.run_id / "s1" / "a2" / "part-00002.parquet").write_bytes(b"torn")
    parts = commits.scan_kept(layout, "s1")
    assert sorted(k for p in parts for k in p.row_keys) == [("f.parquet", k) for k in (0, 1, 2, 3, 5)]


def test_direct_parts_are_kept_before_an_overlapping_staged_part(tmp_path: Path) -> None:
    """A reader already sees the direct parts, so they are kept and the staged overlap is dropped."""
    spec = _spec(tmp_path)
    layout = output_layout(spec).for_run(prepare_output(spec).run_id)
    staged = commits.write_part(layout, "s1", "a1", 0, _part(spec, [1, 2]))
    direct = [
        commits.write_direct(layout, "s1", _part(spec, keys), n) for n, keys in enumerate([[0, 1], [3]])
    ]
    assert all(d is not None for d in direct)
    parts = commits.scan_kept(layout, "s1", direct=[d.data for d in direct if d is not None][::-1])
    assert [p.staged for p in parts] == [layout.direct_part("s1", 0), layout.direct_part("s1", 1)]
    assert staged.staged not in [p.staged for p in parts]


def test_commit_publish_is_idempotent_and_finalize_repairs(tmp_path: Path) -> None:
    spec = _spec(tmp_path)
    layout: Layout = output_layout(spec).for_run(prepare_output(spec).run_id)
    s1 = plan_shards(spec)[0].shard_id  # a shard of the plan: markers of other shards never count
    parts = [
        commits.write_part(layout, s1, "a1", 0, _part(spec, [0, 1])),
        commits.write_part(layout, s1, "a1", 1, _part(spec, [2])),
    ]
    marker = commits.build_marker(layout, s1, "fp", "a1", parts, 0.5, 3)
    # Simulate a crash after the marker but before publication: create it, publish one part only.
    layout.store.create_exclusive(layout.marker(s1), marker.to_json())
    layout.store.copy(parts[0].staged, parts[0].data)
    assert len(list((tmp_path / "out" / "data").rglob("*.parquet"))) == 1
    # A second committer loses the race and adopts the winner's marker.
    loser = commits.build_marker(layout, s1, "fp", "zz", parts[:1], 0.1, 3)
    assert commits.commit(layout, loser).attempt == "a1"
    published = sorted(p.name for p in (tmp_path / "out" / "data").rglob("*.parquet"))
    assert published == ["part-a1-00000.parquet", "part-a1-00001.parquet"]
    assert not (tmp_path / "out" / "_staging" / layout.run_id / s1).exists()
    commits.publish(layout, marker)  # again: nothing to do, no error
    summary = finalize(open_run(spec))
    assert summary.shards_committed == 1 and summary.rows == 3 and not summary.complete


def test_paths_are_normalized_for_resume(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    a = load_job("in/", "out", "tiny", job("summarize"))
    b = load_job(str(tmp_path / "in"), str(tmp_path / "out") + "/", "tiny", job("summarize"))
    assert (a.input, a.output) == (b.input, b.output) and a.fingerprint_hash() == b.fingerprint_hash()
    assert load_job("s3://b/docs/", "s3://b/out/", "tiny").input == "s3://b/docs"


def test_flush_by_seconds_writes_closed_parts(tmp_path: Path) -> None:
    import time

    from prefixflow.pipeline.run.shard_execution import _Flusher

    spec = _spec(tmp_path, output={"flush_rows": 1000, "flush_seconds": 0.05})
    run = prepare_run(spec)
    layout = run.layout
    flusher = _Flusher(run, "s1", output_schema(spec.config, spec.task), spec.config.output)
    for k in range(3):
        time.sleep(0.06)
        flusher.add(base_record(k, f"id{k}", "f.parquet", {}))
    assert [p.rows for p in flusher.parts] == [1, 1, 1]  # publish: direct, so in data/ as parts 0, 1, 2
    assert [p.data for p in flusher.parts] == [layout.direct_part("s1", n) for n in range(3)]
    kept = commits.scan_kept(layout, "s1", direct=[p.data for p in flusher.parts])
    assert [p.rows for p in kept] == [1, 1, 1]


def test_a_column_missing_from_every_file_fails_fast(tmp_path: Path) -> None:
    from prefixflow.pipeline import JobConfigError

    spec = _spec(tmp_path, template="{{ txt }}", keep_columns=["titel"])
    with pytest.raises(JobConfigError) as info:
        prepare_output(spec)
    assert "'titel' (keep_columns)" in str(info.value) and "'txt' (template)" in str(info.value)
    assert "id, text, title" in str(info.value)
    assert not (tmp_path / "out" / "_prefixflow.json").exists()
