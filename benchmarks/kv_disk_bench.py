"""The persistent KV tier (issue 28, ``kv_cache_dir``): what a second run of the same job saves.

A labeling job (shared instructions x documents, rows shuffled) on a SmolLM2-135M-shaped model (random
weights, an HF directory: pp_bench.py's, which loads faster than the embedded GGUF), three
configurations interleaved A B C A B C (``--repeats``), each a fresh engine on the same weights:

- recompute: no ``kv_cache_dir``;
- cold: a new, empty ``kv_cache_dir`` (the first run: computes everything and writes its prompt blocks);
- warm: the directory the cold run just wrote (the second run of the job: reads instead of computing).

The cost model decides every read with its defaults (nothing is forced). Reports computed prompt
tokens, blocks read and bytes read/written, wall seconds (min, median) and process CPU seconds of
``generate`` plus ``close`` (close waits for the writer, so the cold run pays for its writes), with
the load average. Outputs are checked equal across the three.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from benchmarks import prefix_workloads as pw
from benchmarks.common import environment, print_table, write_json
from benchmarks.peers import release
from benchmarks.pp_bench import MODEL, model_dir
from prefixflow.engine.loading.presets import available_presets

COLUMNS = [
    "config",
    "computed_prompt_tokens",
    "computed/distinct",
    "disk_hits",
    "disk_read_MB",
    "disk_written_MB",
    "declined_tokens",
    "wall_min_s",
    "wall_median_s",
    "cpu_min_s",
    "cpu_median_s",
]


def one_run(model: str, work: pw.Workload, options: dict) -> tuple[dict, list[list[int]]]:
    from prefixflow.engine import LLM, SamplingParams

    llm = LLM(model, **options)
    params = [SamplingParams(max_tokens=n, ignore_eos=True) for n in work.max_tokens]
    wall0, cpu0 = time.perf_counter(), time.process_time()
    outs = llm.generate(work.prompts, params)
    llm.close()
    errors = [o.error for o in outs if not o.ok]
    if errors:
        raise SystemExit(f"{len(errors)} requests failed, e.g. {errors[0]}")
    wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    s = llm.stats()
    row = dict(
        computed_prompt_tokens=s.computed_prompt_tokens,
        disk_hits=s.kv_disk_hits,
        disk_read_MB=s.kv_disk_read_bytes / 1e6,
        disk_written_MB=s.kv_disk_written_bytes / 1e6,
        declined_tokens=s.kv_disk_declined_tokens,
        wall_s=wall,
        cpu_s=cpu,
    )
    tokens = [list(o.token_ids) for o in outs]
    del llm, outs
    release()
    return row, tokens


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model",
        default=MODEL,
        help="smollm2-shape (default), a preset, a directory or smollm2-135m-instruct",
    )
    ap.add_argument("--instructions", type=int, default=8)
    ap.add_argument("--docs", type=int, default=4)
    ap.add_argument("--instruction-len", type=int, default=600)
    ap.add_argument("--doc-len", type=int, default=80)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument(
        "--dir", default=None, help="where the cache directories go (default: a temporary folder)"
    )
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    model = model_dir(args.model) if args.model == MODEL or args.model in available_presets() else args.model
    vocab = (
        json.loads((Path(model) / "config.json").read_text())["vocab_size"] if Path(model).is_dir() else 49152
    )
    work = pw.labeling(
        vocab, args.instructions, args.docs, args.instruction_len, args.doc_len, 4, 1.0, seed=0
    )
    distinct = pw.distinct_prefix_tokens(work.prompts)
    base = dict(device="cpu", dtype="float32", block_size=args.block_size, max_num_batched_tokens=2048)
    root = Path(args.dir or tempfile.mkdtemp(prefix="kv_disk_bench_"))
    runs: dict[str, list[dict]] = {"recompute": [], "cold": [], "warm": []}
    reference: list[list[int]] | None = None
    load_before = os.getloadavg()
    for rep in range(args.repeats):
        folder = root / f"run{rep}"
        shutil.rmtree(folder, ignore_errors=True)
        for config, opts in (
            ("recompute", base),
            ("cold", dict(base, kv_cache_dir=str(folder))),
            ("warm", dict(base, kv_cache_dir=str(folder))),
        ):
            row, tokens = one_run(model, work, opts)
            if reference is None:
                reference = tokens
            if tokens != reference:
                raise SystemExit(f"{config}: outputs differ from the first run's")
            runs[config].append(row)
    shutil.rmtree(root, ignore_errors=True)
    rows = []
    for config, rs in runs.items():
        walls, cpus = [r["wall_s"] for r in rs], [r["cpu_s"] for r in rs]
        first = rs[0]
        rows.append(
            dict(
                config=config,
                computed_prompt_tokens=first["computed_prompt_tokens"],
                **{"computed/distinct": first["computed_prompt_tokens"] / distinct},
                disk_hits=first["disk_hits"],
                disk_read_MB=first["disk_read_MB"],
                disk_written_MB=first["disk_written_MB"],
                declined_tokens=first["declined_tokens"],
                wall_min_s=min(walls),
                wall_median_s=statistics.median(walls),
                cpu_min_s=min(cpus),
                cpu_median_s=statistics.median(cpus),
                walls=walls,
                cpus=cpus,
            )
        )
    print_table(
        rows, COLUMNS, title=f"labeling on {args.model}: {work.describe()}, distinct tokens {distinct}"
    )
    result = {
        "benchmark": "kv_disk_bench",
        "args": vars(args),
        "environment": environment(),
        "distinct_prompt_tokens": distinct,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "runs": rows,
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
