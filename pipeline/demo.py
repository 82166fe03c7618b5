"""`prefixflow demo`: the bundled sample reviews -> Parquet -> a summarization and a labeling job."""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from rich.console import Console

from prefixflow.pipeline.errors import PipelineError
from prefixflow.pipeline.job.spec import JobSpec, load_job
from prefixflow.pipeline.local_run import print_summary, run_local
from prefixflow.pipeline.run.record import output_layout, read_run_record

if TYPE_CHECKING:
    from prefixflow.engine import ThreadPlan

JOBS = (("summarize", "demo_summarize.yaml"), ("label", "demo_label.yaml"), ("extract", "demo_extract.yaml"))
DATA = Path(__file__).resolve().parent / "data"  # shipped as package data (pyproject [tool.setuptools])
MAX_ROWS = 24


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


def model_folder(model: str, rows: int) -> str:
    """Where one model's demo results go: presets by name, paths by base name plus a digest of the
    full path, so two models (or two sample sizes) never share, and so never overwrite, a folder."""
    name = model
    if os.sep in model or model.endswith(".gguf") or os.path.exists(model):
        base = os.path.basename(os.path.normpath(model)).removesuffix(".gguf")
        digest = hashlib.sha1(os.path.abspath(os.path.expanduser(model)).encode()).hexdigest()[:8]
        name = f"{base}-{digest}"
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", name).strip("._") or "model"
    return name if rows == MAX_ROWS else f"{name}-{rows}rows"


def run_demo(
    workdir: str,
    model: str,
    rows: int,
    console: Console,
    report: Console | None = None,
    threads: ThreadPlan | None = None,
) -> int:
    """Write the sample, then run both demo jobs into WORKDIR/<model>/ (see ``model_folder``).

    Rerunning with the same model resumes (nothing is redone); another model gets its own folder.
    Progress and notes go to ``console`` (stderr), results (summaries, sample rows, how to read
    them) to ``report`` (stdout)."""
    report = report or console
    rows = max(1, min(rows, MAX_ROWS))
    workdir = os.path.abspath(workdir)
    data = write_sample(os.path.join(workdir, "input" if rows == MAX_ROWS else f"input-{rows}rows"), rows)
    results = os.path.join(workdir, model_folder(model, rows))
    console.print(f"[bold]sample data[/] {data}  ({rows} product reviews)")
    report.print(f"[bold]results[/] {results}  (model {model})", soft_wrap=True)
    from prefixflow.pipeline.job.spec import open_engine

    llm = None
    failed = 0
    timings: list[tuple[str, float, float]] = []  # (step, wall s, process CPU s)
    for name, job_file in JOBS:
        job = str(DATA / job_file)
        spec = load_job(data, os.path.join(results, f"{name}-out"), model, job)
        _note_replaced(spec, console)
        if llm is None:
            with _timed("load model", timings):
                llm = open_engine(spec)
        report.rule(f"{name} job")
        with _timed(name, timings):
            summary, failures = run_local(spec, new_run=True, llm=llm, console=console)
        failed += len(failures)
        print_summary(report, summary)
        df = pl.read_parquet(summary.data_glob).sort("id")
        report.print("[bold]sample rows[/]")
        for row in df.head(4).to_dicts():
            if name == "label":
                probs = ", ".join(f"{k} {v:.2f}" for k, v in (row["label_probs"] or {}).items())
                result = f"{row['label']}  ({probs})"
            elif name == "extract":
                result = str(row["extracted"] or row["error"])[:100]
            else:
                result = (row["output"] or row["error"] or "").strip().replace("\n", " ")[:100]
            report.print(f"  {row['id']}  {row['title']:<14} -> {result}", markup=False, soft_wrap=True)
    report.rule("read the results")
    summaries = os.path.join(results, "summarize-out", "data", "**", "*.parquet")
    labels = os.path.join(results, "label-out", "data", "**", "*.parquet")
    extracted = os.path.join(results, "extract-out", "data", "**", "*.parquet")
    snippet = (
        f"import polars as pl\nsummaries = pl.read_parquet({summaries!r})\n"
        f"labels = pl.read_parquet({labels!r})\nprint(labels.select('id', 'label', 'label_probs').unnest('label_probs'))\n"
        f"extracted = pl.read_parquet({extracted!r})\nprint(extracted.select('id', 'extracted').unnest('extracted'))"
    )
    report.print(snippet, markup=False, soft_wrap=True)
    report.print(f"status: prefixflow status {os.path.join(results, 'label-out')}", markup=False)
    report.print(timings_line(timings, threads.compute if threads else None), markup=False, soft_wrap=True)
    return 1 if failed else 0


@contextmanager
def _timed(step: str, timings: list[tuple[str, float, float]]) -> Iterator[None]:
    wall, cpu = time.perf_counter(), time.process_time()
    try:
        yield
    finally:
        timings.append((step, time.perf_counter() - wall, time.process_time() - cpu))


def timings_line(timings: list[tuple[str, float, float]], threads: int | None = None) -> str:
    """``time per job: load model 3.1 s, summarize 20.4 s, ...; total 41.0 s (CPU 60.2 s: load model
    2.9, summarize 19.8, ...; load average 1.1, 1 compute thread)``: per-job CPU-seconds, the load
    average and the thread count say whether a slow demo was the host's doing."""
    steps = ", ".join(f"{step} {wall:.1f} s" for step, wall, _ in timings)
    cpus = ", ".join(f"{step} {cpu:.1f}" for step, _, cpu in timings)
    wall, cpu = sum(t[1] for t in timings), sum(t[2] for t in timings)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    tail = "" if threads is None else f", {threads} compute thread{'s' if threads != 1 else ''}"
    return (
        f"time per job: {steps}; total {wall:.1f} s (CPU {cpu:.1f} s: {cpus}; load average {load:.1f}{tail})"
    )


def _note_replaced(spec: JobSpec, console: Console) -> None:
    """The demo starts over when its own earlier run in this folder has other settings (a newer
    prefixflow's demo job): say so rather than replace it silently."""
    try:
        record = read_run_record(output_layout(spec))
        fingerprint = record.fingerprint_hash if record is not None else None
    except PipelineError:
        fingerprint = "unreadable"
    if fingerprint is not None and fingerprint != spec.fingerprint_hash():
        console.print(
            f"[yellow]note:[/] replacing the earlier demo run in {spec.output} (its settings differ)",
            soft_wrap=True,
        )
