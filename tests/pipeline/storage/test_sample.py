"""The sample spreads over every shard, reads little, and skips unreadable files without failing."""

from __future__ import annotations

from prefixflow.pipeline.job.spec import load_job
from prefixflow.pipeline.run.planning import plan_shards
from prefixflow.pipeline.storage import sample as sampling
from tests.pipeline.support import docs, write_parquet


def _spec(folder, shard_rows: int = 50):
    return load_job(
        str(folder),
        "",
        "tiny",
        {"task": "summarize", "id_column": "id", "output": {"shard_rows": shard_rows}},
    )


def test_small_inputs_are_read_whole(tmp_path) -> None:
    write_parquet(tmp_path / "a.parquet", docs(30), row_group_size=7)
    spec = _spec(tmp_path)
    s = sampling.sample_rows(spec, plan_shards(spec), 100)
    assert s.total_rows == 30 and len(s.rows) == 30 and s.scale == 1.0
    assert [r.row["id"] for r in s.rows] == [d["id"] for d in docs(30)]


def test_the_sample_covers_every_file_and_row_group(tmp_path) -> None:
    for f in range(3):
        write_parquet(tmp_path / f"p{f}.parquet", docs(400, start=1000 * f), row_group_size=100)
    spec = _spec(tmp_path, shard_rows=200)
    shards = plan_shards(spec)
    s = sampling.sample_rows(spec, shards, 60)
    assert len(s.rows) == 60 and s.total_rows == 1200 and s.scale == 20.0
    groups = {(r.relpath, r.row_index // 100) for r in s.rows}
    assert len(groups) == 12  # 3 files x 4 row groups, 5 rows each
    # within a row group the rows are spread out, not the first five
    first = sorted(r.row_index for r in s.rows if r.relpath == "p0.parquet" and r.row_index < 100)
    assert first == [0, 20, 40, 60, 80]


def test_reading_is_bounded_per_row_group(tmp_path, monkeypatch) -> None:
    write_parquet(tmp_path / "big.parquet", docs(3000), row_group_size=3000)
    monkeypatch.setattr(sampling, "UNIT_READ_ROWS", 256)
    spec = _spec(tmp_path, shard_rows=5000)
    s = sampling.sample_rows(spec, plan_shards(spec), 8)
    assert [r.row_index for r in s.rows] == [0, 32, 64, 96, 128, 160, 192, 224]


def test_unreadable_files_are_skipped_and_named(tmp_path) -> None:
    write_parquet(tmp_path / "good.parquet", docs(20), row_group_size=5)
    (tmp_path / "bad.parquet").write_bytes(b"not parquet at all")
    spec = _spec(tmp_path)
    s = sampling.sample_rows(spec, plan_shards(spec), 10)
    assert len(s.rows) == 10 and all(r.relpath == "good.parquet" for r in s.rows)
    assert len(s.skipped_shards) == 1 and "bad" in s.skipped_shards[0]
