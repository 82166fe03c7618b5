"""The documented recipe restores input order: rows are written as they finish (prefix order, shards in
any order), and sorting by (source_file, row_index) gives the input back."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from prefixflow.pipeline import load_job
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import job, write_parquet


def test_sorting_by_source_file_and_row_index_restores_input_order(tmp_path: Path, tiny_llm) -> None:
    # prompts whose prefix order differs from their input order
    rows = [
        {"id": f"r{i}", "text": t}
        for i, t in enumerate(["zebra one", "apple two", "mango", "apple one", "kiwi"])
    ]
    write_parquet(tmp_path / "in" / "b.parquet", rows)
    write_parquet(tmp_path / "in" / "a.parquet", [{"id": "a0", "text": "yak"}, {"id": "a1", "text": "ant"}])
    spec = load_job(
        str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate", template="{{ text }}")
    )
    summary, _ = run_local(spec, llm=tiny_llm, progress=False)
    written = pl.read_parquet(summary.data_glob)
    assert written["id"].to_list() != [
        "a0",
        "a1",
        *[r["id"] for r in rows],
    ]  # finished order, not input order
    restored = pl.scan_parquet(summary.data_glob).sort("source_file", "row_index").collect()
    assert restored["id"].to_list() == ["a0", "a1", *[r["id"] for r in rows]]
