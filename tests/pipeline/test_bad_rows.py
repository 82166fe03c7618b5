"""A dataset with every kind of bad row: each becomes one error row with its class; the job completes."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pyarrow as pa

from prefixflow.pipeline import load_job
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import job, write_parquet

LONG = " ".join(["word"] * 400)


def _dataset(folder: Path) -> None:
    schema = pa.schema([("id", pa.string()), ("text", pa.string()), ("n", pa.int64()), ("mt", pa.int64())])
    write_parquet(
        folder / "a.parquet",
        [
            {"id": "a0", "text": "a fine short text", "n": 1, "mt": None},
            {"id": None, "text": "no id here", "n": 1, "mt": None},
            {"id": "a0", "text": "same id as a0", "n": 1, "mt": None},
            {"id": "a3", "text": None, "n": 1, "mt": None},
            {"id": "a4", "text": "   ", "n": 1, "mt": None},
            {"id": "a5", "text": "division by zero in the template", "n": 0, "mt": None},
            {"id": "a6", "text": LONG, "n": 1, "mt": None},
            {"id": "a7", "text": "negative max tokens", "n": 1, "mt": -3},
            {"id": "a8", "text": "two tokens only", "n": 1, "mt": 2},
        ],
        schema=schema,
    )
    write_parquet(
        folder / "b.parquet",
        [
            {"id": "b0", "text": b"\xff\xfe not utf-8", "n": 1, "mt": None},
            {"id": "b1", "text": b"valid bytes", "n": 1, "mt": None},
        ],
        schema=pa.schema([("id", pa.string()), ("text", pa.binary()), ("n", pa.int64()), ("mt", pa.int64())]),
    )
    write_parquet(
        folder / "c.parquet",
        [{"id": "c0", "text": 42, "n": 1, "mt": None}],
        schema=pa.schema([("id", pa.string()), ("text", pa.int64()), ("n", pa.int64()), ("mt", pa.int64())]),
    )
    write_parquet(folder / "d.parquet", [{"id": "d0", "text": "the n column is missing in this file"}])


def test_every_bad_row_case(tmp_path: Path, tiny_llm) -> None:
    _dataset(tmp_path / "in")
    cfg = job(
        "summarize",
        template="Summarize: {{ document }} ({{ 100 // n }})",
        sampling_columns={"max_tokens": "mt"},
        summarize={"document_column": "text", "long_document": "error"},
        chat="off",
    )
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert failures == [] and summary.complete
    df = pl.read_parquet(summary.data_glob)
    assert df.height == 13
    got = {(r["source_file"], r["row_index"]): r for r in df.to_dicts()}
    expect = {
        ("a.parquet", 1): "null_id",
        ("a.parquet", 2): "duplicate_id",
        ("a.parquet", 3): "null_prompt",
        ("a.parquet", 4): "empty_prompt",
        ("a.parquet", 5): "template_error",
        ("a.parquet", 6): "prompt_too_long",
        ("a.parquet", 7): "bad_sampling",
        ("b.parquet", 0): "undecodable_text",
        ("c.parquet", 0): "bad_type",
        ("d.parquet", 0): "template_error",
    }
    for key, row in got.items():
        assert row["error_class"] == expect.get(key), (key, row)
        if key in expect:
            assert row["finish_reason"] == "error" and row["error"] and row["output"] is None
        else:
            assert (
                row["error"] is None
                and row["finish_reason"] in ("stop", "length")
                and row["output_tokens"] >= 1
            )
    assert got[("a.parquet", 8)]["output_tokens"] <= 2  # per-row max_tokens override from column mt
    assert got[("a.parquet", 0)]["output_tokens"] <= 4
    assert got[("a.parquet", 1)]["id"] == "a.parquet#1"  # null id falls back to the derived id
    assert "ids must be unique" in got[("a.parquet", 2)]["error"]
    assert (
        "already used by row 0 of a.parquet (a.parquet#0)" in got[("a.parquet", 2)]["error"]
    )  # the earlier row
    assert "tokens" in got[("a.parquet", 6)]["error"]
    counts: dict[str, int] = {}
    for c in expect.values():
        counts[c] = counts.get(c, 0) + 1
    assert summary.errors_by_class == dict(sorted(counts.items()))
    assert summary.error_rows == 10 and summary.rows == 13


def test_readers_agree_on_committed_rows(tmp_path: Path, tiny_llm) -> None:
    """polars, pyarrow datasets and DuckDB read the documented glob / folder and see each row once."""
    import duckdb
    import pyarrow.dataset as ds

    from tests.pipeline.support import write_dataset

    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=6)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate"))
    summary, _ = run_local(spec, llm=tiny_llm, progress=False)
    (tmp_path / "out" / "_staging" / "orphan" / "a").mkdir(parents=True)  # leftovers are outside data/
    assert sorted(pl.scan_parquet(summary.data_glob).collect()["id"].to_list()) == sorted(ids)
    assert ds.dataset(str(tmp_path / "out" / "data"), format="parquet").count_rows() == 12
    query = f"SELECT count(*), count(DISTINCT id) FROM read_parquet('{summary.data_glob}')"
    ((n, distinct),) = duckdb.sql(query).fetchall()
    assert n == distinct == 12


def test_output_columns_match_the_reserved_names() -> None:
    from prefixflow.pipeline.job.config import OUTPUT_COLUMNS
    from prefixflow.pipeline.job.spec import parse_job_config
    from prefixflow.pipeline.tasks.output_schema import output_schema
    from prefixflow.pipeline.tasks.registry import task_of

    cfg = parse_job_config(
        {"task": "label", "template": "x", "label": {"labels": ["a", "b"], "gold_column": "y"}}
    )
    extract = parse_job_config({"task": "extract", "template": "x", "schema": {"type": "object"}})
    several = parse_job_config({"template": "x", "sampling": {"n": 2}})  # samples only with n
    names = output_schema(cfg, task_of(cfg)).names
    for other in (extract, several):
        names += [
            n for n in output_schema(other, task_of(other)).names if n not in names
        ]  # + extracted, samples
    assert names == list(OUTPUT_COLUMNS)
