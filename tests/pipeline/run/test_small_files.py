"""Issue 22 item 13: many small input files. 2,000 one-row files took 751 s, one shard (and one round of
per-shard cost) per file; now consecutive small files are packed into shards of up to ``shard_rows``.

Every guarantee holds across a packed shard: rows exactly once (also after a kill inside it), input
identity per file, error rows, derived ids for null ids per file, kept columns. A run planned before
packing (its record has no plan version) resumes with the plan it started with."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import polars as pl
import pytest
import s3fs

from prefixflow.pipeline import InputChanged, load_job, plan_shards, status
from prefixflow.pipeline.local_run import run_local
from prefixflow.pipeline.run import commit, planning, record, shard_execution
from prefixflow.pipeline.storage.store import Store
from tests.pipeline.run.test_round_trips import JOB, counted_calls, counted_requests
from tests.pipeline.support import job, write_parquet

CFG = job(
    "generate",
    keep_columns=["title"],
    sampling={"max_tokens": 1},
    output={"shard_rows": 5, "flush_rows": 2},
)


def _write_small(folder: Path, n: int = 12) -> list[str]:
    """``n`` one-row files; the id of file 3 is null and file 7's text is an int (an error row)."""
    ids = []
    for i in range(n):
        row = {"id": f"doc-{i:03d}", "title": f"t{i}", "text": f"word {i}"}
        if i == 3:
            row["id"] = None
        if i == 7:
            row["text"] = None
        write_parquet(folder / f"f{i:03d}.parquet", [row], row_group_size=1)
        ids.append(row["id"] if row["id"] is not None else f"f{i:03d}.parquet#0")
    return ids


def _spec(tmp_path: Path):
    return load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", CFG)


def _output(tmp_path: Path) -> pl.DataFrame:
    return pl.read_parquet(str(tmp_path / "out" / "data" / "**" / "*.parquet")).sort("source_file")


def test_small_files_are_packed_into_shards_of_up_to_shard_rows(tmp_path: Path) -> None:
    _write_small(tmp_path / "in", 12)
    write_parquet(tmp_path / "in" / "f005b.parquet", [{"id": f"big-{i}", "text": "x"} for i in range(7)], 7)
    shards = plan_shards(_spec(tmp_path))
    # f000-f004 (5 rows), f005 alone (the 7-row file after it is not small), the big file, f006-f010,
    # f011 alone: a single small file keeps its own shard id of plan version 1
    assert [len(s.ranges()) for s in shards] == [5, 1, 1, 5, 1]
    assert [s.num_rows for s in shards] == [5, 1, 7, 5, 1]
    unpacked = plan_shards(_spec(tmp_path), version=1)
    assert len(unpacked) == 13
    assert {s.shard_id for s in shards if not s.pieces} <= {s.shard_id for s in unpacked}
    assert [p.relpath for p in shards[0].pieces] == [f"f{i:03d}.parquet" for i in range(5)]
    assert plan_shards(_spec(tmp_path)) == shards  # stable ids


def test_a_packed_run_keeps_every_per_file_guarantee(tmp_path: Path, tiny_llm) -> None:
    ids = _write_small(tmp_path / "in", 12)
    summary, failures = run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete and summary.rows == 12 and summary.shards_total == 3
    out = _output(tmp_path)
    assert sorted(out["id"].to_list()) == sorted(ids) and out["id"].n_unique() == 12
    assert out["source_file"].to_list() == [f"f{i:03d}.parquet" for i in range(12)]
    assert out["row_index"].to_list() == [0] * 12
    assert out["title"].to_list() == [f"t{i}" for i in range(12)]
    errors = out.filter(pl.col("error_class").is_not_null())
    assert sorted(errors["source_file"].to_list()) == ["f003.parquet", "f007.parquet"]
    assert out.filter(pl.col("source_file") == "f003.parquet")["id"].to_list() == ["f003.parquet#0"]
    # a packed shard's parts are under its own id, like any shard's
    shard_dirs = sorted(p.name for p in (tmp_path / "out" / "data").glob("*/*"))
    assert len(shard_dirs) == 3 and all("-pack" in d for d in shard_dirs)

    # input identity is still per file: one changed file inside a pack is refused by name
    write_parquet(tmp_path / "in" / "f002.parquet", [{"id": "doc-002", "title": "t2", "text": "new"}], 1)
    with pytest.raises(InputChanged, match="f002.parquet changed"):
        run_local(_spec(tmp_path), llm=tiny_llm, progress=False)


def test_a_kill_inside_a_packed_shard_resumes_its_flushed_rows_exactly_once(
    tmp_path: Path, tiny_llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run dies at its second flush (2 rows of the first packed shard staged, from 2 files): the
    resume keeps them and generates only the other rows."""
    ids = _write_small(tmp_path / "in", 12)
    flushes: list[str] = []

    def die_at_second_flush(name: str) -> None:
        if name == "flush_begin":
            flushes.append(name)
            if len(flushes) == 2:
                raise KeyboardInterrupt

    monkeypatch.setattr(shard_execution, "hook", die_at_second_flush)
    with pytest.raises(KeyboardInterrupt):
        run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    monkeypatch.undo()
    summary, failures = run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete and summary.rows == 12
    out = _output(tmp_path)
    assert sorted(out["id"].to_list()) == sorted(ids) and out["id"].n_unique() == 12


def test_a_run_planned_before_packing_resumes_with_its_own_plan(
    tmp_path: Path, tiny_llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A record without ``plan_version`` (written before packing) is planned one file per shard: its
    committed shards still count, the rest are generated under the same ids, rows exactly once."""
    ids = _write_small(tmp_path / "in", 12)
    monkeypatch.setattr(planning, "PLAN_VERSION", 1)
    monkeypatch.setattr(record, "PLAN_VERSION", 1)
    commits: list[str] = []

    def stop_after_four(name: str) -> None:
        if name == "commit_begin":
            commits.append(name)
            if len(commits) == 5:
                raise KeyboardInterrupt

    monkeypatch.setattr(commit, "hook", stop_after_four)
    with pytest.raises(KeyboardInterrupt):
        run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    monkeypatch.undo()
    path = tmp_path / "out" / "_prefixflow.json"
    old = json.loads(path.read_text())
    old.pop("plan_version")  # exactly what an older prefixflow wrote
    path.write_text(json.dumps(old))

    summary, failures = run_local(_spec(tmp_path), llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete and summary.rows == 12 and summary.shards_total == 12
    out = _output(tmp_path)
    assert sorted(out["id"].to_list()) == sorted(ids) and out["id"].n_unique() == 12
    assert status(str(tmp_path / "out"))[0].complete
    # --new-run starts over with packed shards
    summary, _ = run_local(_spec(tmp_path), new_run=True, llm=tiny_llm, progress=False)
    assert summary.complete and summary.shards_total == 3 and summary.rows == 12
    assert json.loads(path.read_text())["plan_version"] == planning.PLAN_VERSION


def test_a_run_over_small_files_reads_each_input_file_once(tmp_path: Path, tiny_llm) -> None:
    """Planning opened each input file about 10 times (plan, schemas and identities twice, the id index,
    the advisor's sample twice, the shard's read) plus 2 `info` calls; now the whole command reads each
    file once (sources.reads_cached) and asks nothing else about it."""
    n = 30
    for i in range(n):
        write_parquet(tmp_path / "in" / f"f{i:03d}.parquet", [{"id": f"r{i}", "text": f"w {i}"}], 1)
    spec = load_job(
        str(tmp_path / "in"), str(tmp_path / "out"), "tiny", dict(JOB, output={"shard_rows": 1000})
    )
    with counted_calls(str(tmp_path / "out"), Store.open(spec.input, spec.config.storage)) as calls:
        summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete and summary.rows == n and summary.shards_total == 1
    assert calls[("read", "input")] == n, calls
    assert calls[("exists", "input")] == 0, calls
    assert calls[("list", "input")] < n, calls  # listings per command, not per file


def test_on_s3_each_small_input_file_costs_one_get_and_one_head(
    tmp_path: Path, s3_endpoint: str, tiny_llm
) -> None:
    """The same on S3 (moto's server, every HTTP request counted): per input file one GET of its bytes
    and one HEAD for its identity (ETag, version id), whatever the number of planning steps."""
    n = 12
    bucket = f"small-{uuid.uuid4().hex[:8]}"
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir(bucket)
    for i in range(n):
        write_parquet(tmp_path / "in" / f"f{i:03d}.parquet", [{"id": f"r{i}", "text": f"w {i}"}], 1)
    fs.put(str(tmp_path / "in") + "/", f"{bucket}/in/", recursive=True)
    out = f"s3://{bucket}/out"
    spec = load_job(
        f"s3://{bucket}/in", out, "tiny", dict(JOB, output={"shard_rows": 1000}), endpoint_url=s3_endpoint
    )
    with counted_requests(out, Store.open(out, spec.config.storage)) as calls:
        summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete and summary.rows == n and summary.shards_total == 1
    assert calls[("read", "input")] == n and calls[("exists", "input")] == n, calls
