"""`prefixflow demo`: the bundled sample reviews -> Parquet -> a summarization and a labeling job."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from prefixflow.pipeline.local_run import print_summary, run_local
from prefixflow.pipeline.spec import load_job

JOBS = (("summarize", "demo_summarize.yaml"), ("label", "demo_label.yaml"))
DATA = Path(__file__).resolve().parent / "data"  # shipped as package data (pyproject [tool.setuptools])


def sample_rows(limit: int = 24) -> list[dict[str, Any]]:
    text = (DATA / "demo_reviews.jsonl").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()][:limit]


def write_sample(folder: str, limit: int = 24) -> str:
    """Write the sample as one Parquet file with several row groups (one shard: the CPU engine is
    fastest when all rows decode in one batch)."""
    os.makedirs(folder, exist_ok=True)
    table = pa.Table.from_pylist(sample_rows(limit))
    pq.write_table(table, os.path.join(folder, "reviews.parquet"), row_group_size=6)
    return folder


def run_demo(workdir: str, model: str, rows: int, console: Console) -> int:
    workdir = os.path.abspath(workdir)
    data = write_sample(os.path.join(workdir, "input"), max(1, min(rows, 24)))
    console.print(f"[bold]sample data[/] {data}  ({min(rows, 24)} product reviews)")
    from prefixflow.pipeline.engine_access import open_engine

    llm = None
    failed = 0
    for name, job_file in JOBS:
        job = str(DATA / job_file)
        spec = load_job(data, os.path.join(workdir, f"{name}-out"), model, job)
        llm = llm or open_engine(spec)
        console.rule(f"{name} job")
        summary, failures = run_local(spec, new_run=True, llm=llm, console=console)
        failed += len(failures)
        print_summary(console, summary)
        df = pl.read_parquet(summary.data_glob).sort("id")
        console.print("[bold]sample rows[/]")
        for row in df.head(4).to_dicts():
            if name == "label":
                probs = ", ".join(f"{k} {v:.2f}" for k, v in (row["label_probs"] or {}).items())
                result = f"{row['label']}  ({probs})"
            else:
                result = (row["output"] or row["error"] or "").strip().replace("\n", " ")[:100]
            console.print(f"  {row['id']}  {row['title']:<14} -> {result}", markup=False, soft_wrap=True)
    console.rule("read the results")
    summaries = os.path.join(workdir, "summarize-out", "data", "**", "*.parquet")
    labels = os.path.join(workdir, "label-out", "data", "**", "*.parquet")
    snippet = (f"import polars as pl\nsummaries = pl.read_parquet({summaries!r})\n"
               f"labels = pl.read_parquet({labels!r})\nprint(labels.select('id', 'label', 'label_probs').unnest('label_probs'))")  # fmt: skip
    console.print(snippet, markup=False, soft_wrap=True)
    console.print(f"status: prefixflow status {os.path.join(workdir, 'label-out')}", markup=False)
    return 1 if failed else 0
