"""One output schema per run, fixed at plan time: every committed output reads with polars, pyarrow and
DuckDB even when a kept column's type differs between input files (issue 10, item 5)."""

from __future__ import annotations

from pathlib import Path

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.dataset as ds
import pytest

from prefixflow.pipeline import JobConfigError, load_job, prepare_output
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import docs, job, write_parquet


def test_kept_column_missing_from_one_file_reads_everywhere(tmp_path: Path, tiny_llm) -> None:
    rows = docs(8)
    write_parquet(
        tmp_path / "in" / "a.parquet", [{**r, "title": i} for i, r in enumerate(rows[:4])], row_group_size=2
    )
    write_parquet(
        tmp_path / "in" / "b.parquet",
        [{"id": r["id"], "text": r["text"]} for r in rows[4:]],
        row_group_size=2,
    )
    out = tmp_path / "out"
    spec = load_job(str(tmp_path / "in"), str(out), "tiny", job("generate", keep_columns=["title"]))
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert summary.complete and not failures
    glob = str(out / "data" / "**" / "*.parquet")
    frame = pl.scan_parquet(
        glob
    ).collect()  # failed with SchemaError before: int64 in one part, string in the other
    assert frame.height == 8 and frame["title"].dtype == pl.Int64 and frame["title"].null_count() == 4
    table = ds.dataset(str(out / "data"), format="parquet").to_table()
    assert table.num_rows == 8 and table.schema.field("title").type == pa.int64()
    assert duckdb.sql(
        f"SELECT count(*), count(title), sum(title) FROM read_parquet('{glob}')"
    ).fetchall() == [(8, 4, 6)]


def test_irreconcilable_kept_column_types_are_refused_naming_column_and_files(tmp_path: Path) -> None:
    rows = docs(4)
    write_parquet(tmp_path / "in" / "c.parquet", [{**r, "tags": "x"} for r in rows[:2]])
    write_parquet(tmp_path / "in" / "d.parquet", [{**r, "tags": ["x", "y"]} for r in rows[2:]])
    spec = load_job(
        str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate", keep_columns=["tags"])
    )
    with pytest.raises(JobConfigError) as info:
        prepare_output(spec)
    message = str(info.value)
    assert "'tags'" in message and "c.parquet" in message and "d.parquet" in message
    assert "string" in message and "list" in message
    assert not (tmp_path / "out").exists()
