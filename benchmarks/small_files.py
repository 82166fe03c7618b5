"""Issue 22 item 13: a run over many one-row Parquet files, before and after small files are packed.

    PYTHONPATH=. python benchmarks/small_files.py --files 2000 --rounds 2 [--json out.json]

"before" is the plan of a run recorded before packing (plan version 1: one shard per file) with each
input file opened by every planning step (no ``sources.reads_cached``), which is what the code did
before this change; "after" is today's default (packed shards, each file read once). Both run
``run_local`` in this one process, interleaved (before, after, before, after ...), each into a fresh
output, on one tiny engine loaded once (``--model tiny``, ``max_tokens: 1``; load time not counted).
Reported per run: wall seconds, process CPU-seconds (all threads), shards, input reads, and the load
average around it; then min and median per variant.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prefixflow.pipeline import (
    load_job,  # noqa: E402
    local_run,  # noqa: E402
)
from prefixflow.pipeline.job.spec import open_engine  # noqa: E402
from prefixflow.pipeline.run import planning, record  # noqa: E402
from prefixflow.pipeline.storage import sources  # noqa: E402

JOB = {
    "task": "generate",
    "id_column": "id",
    "template": "Say: {{ text }}",
    "engine": {"max_model_len": 160, "max_num_seqs": 32},
    "sampling": {"max_tokens": 1},
    "output": {"shard_rows": 1000, "flush_rows": 1000},
}


def write_input(folder: Path, n: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        table = pa.Table.from_pylist([{"id": f"r{i:05d}", "text": f"item {i}"}])
        pq.write_table(table, folder / f"f{i:05d}.parquet")


@contextlib.contextmanager
def before() -> Iterator[None]:
    """The code before this change: plan version 1, and no read-once scope."""
    saved = (planning.PLAN_VERSION, record.PLAN_VERSION, local_run.reads_cached)
    planning.PLAN_VERSION = record.PLAN_VERSION = 1
    local_run.reads_cached = contextlib.nullcontext  # type: ignore[assignment]
    try:
        yield
    finally:
        planning.PLAN_VERSION, record.PLAN_VERSION, local_run.reads_cached = saved


@contextlib.contextmanager
def count_reads() -> Iterator[Counter[str]]:
    """Input-file reads: parquet opens that reach the store (sources._open) and footer/identity reads."""
    counts: Counter[str] = Counter()
    original = sources._open

    def counted(store: Any, path: str, size: int | None) -> Any:
        counts["opens"] += 1
        return original(store, path, size)

    sources._open = counted  # type: ignore[assignment]
    try:
        yield counts
    finally:
        sources._open = original  # type: ignore[assignment]


def one_run(inp: Path, out: Path, llm: Any, variant: str) -> dict[str, Any]:
    spec = load_job(str(inp), str(out), "tiny", JOB)
    load0 = os.getloadavg()[0]
    with before() if variant == "before" else contextlib.nullcontext(), count_reads() as reads:
        wall0, cpu0 = time.perf_counter(), time.process_time()
        summary, failures = local_run.run_local(spec, llm=llm, progress=False)
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    assert not failures and summary.complete, failures
    return {
        "variant": variant,
        "wall_s": round(wall, 2),
        "cpu_s": round(cpu, 2),
        "shards": summary.shards_total,
        "rows": summary.rows,
        "parquet_opens": reads["opens"],
        "load_avg": [round(load0, 1), round(os.getloadavg()[0], 1)],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--files", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default="")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pf-small-files-"))
    write_input(work / "in", args.files)
    llm = open_engine(load_job(str(work / "in"), str(work / "o"), "tiny", JOB))
    runs = []
    for r in range(args.rounds):
        for variant in ("before", "after"):
            res = one_run(work / "in", work / f"out-{variant}-{r}", llm, variant)
            print(json.dumps(res), flush=True)
            runs.append(res)
    summary = {}
    for variant in ("before", "after"):
        mine = [x for x in runs if x["variant"] == variant]
        summary[variant] = {
            k: {"min": min(x[k] for x in mine), "median": statistics.median(x[k] for x in mine)}
            for k in ("wall_s", "cpu_s")
        }
        summary[variant]["per_file_cpu_ms"] = round(
            summary[variant]["cpu_s"]["median"] / args.files * 1000, 1
        )
    print(json.dumps({"files": args.files, "rounds": args.rounds, "summary": summary}), flush=True)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"files": args.files, "runs": runs, "summary": summary}, indent=1)
        )


if __name__ == "__main__":
    main()
