"""KV memory hierarchy (issue 28): recompute vs the host tier, and block- vs token-granular sharing.

Three workloads, each run interleaved A B A B (``--repeats``) in one process on the same weights:

- labeling: 64 distinct ~1,000-token instructions x 16 documents, rows shuffled and admitted in that
  order (fifo), a device pool of about 1/4 of the working set: recompute vs host tier;
- long: documents of 2-4k tokens at high concurrency, a pool that forces preemption: recompute vs
  host tier;
- short: short documents under shared instructions: block-granular vs token-granular sharing.

Reports computed prompt tokens (and / distinct trie tokens), offloaded / reloaded / recomputed tokens,
wall seconds (min, median), process CPU seconds and output tok/s, with the load average.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import time
from collections.abc import Sequence

from benchmarks import prefix_workloads as pw
from benchmarks.common import (
    add_common_args,
    build_model,
    environment,
    print_table,
    random_tokens,
    setup_threads,
    write_json,
)
from benchmarks.peers import make_llm, release, run_prefixflow

COLUMNS = [
    "workload",
    "config",
    "kv_blocks",
    "computed_prompt_tokens",
    "computed/distinct",
    "offloaded",
    "reloaded",
    "recomputed",
    "host_hit_rate",
    "preemptions",
    "wall_min_s",
    "wall_median_s",
    "cpu_s",
    "output_tok_s",
]


def long_docs(vocab: int, n: int, lo: int, hi: int, output_len: int, seed: int) -> pw.Workload:
    rng = random.Random(seed)
    prompts = [random_tokens(rng, rng.randint(lo, hi), vocab) for _ in range(n)]
    return pw.Workload("long", prompts, [output_len] * n, {"docs": n, "lo": lo, "hi": hi})


def pool_blocks(work: pw.Workload, block_size: int, frac: float) -> int:
    longest = max(len(p) + m for p, m in zip(work.prompts, work.max_tokens))
    return max(
        -(-longest // block_size) * 2, round(frac * pw.distinct_prefix_tokens(work.prompts) / block_size)
    )


def run_pair(bm, work: pw.Workload, configs: list[dict], repeats: int) -> list[dict]:
    distinct = pw.distinct_prefix_tokens(work.prompts)
    runs: dict[str, list[dict]] = {c["config"]: [] for c in configs}
    for _ in range(repeats):
        for cfg in configs:
            opts = {k: v for k, v in cfg.items() if k not in ("config", "share_partial_blocks")}
            llm = make_llm(bm, **opts)
            llm.engine.kv.share_partial_blocks = cfg.get("share_partial_blocks", True)
            cpu0 = time.process_time()
            res = run_prefixflow(llm, work.prompts, work.max_tokens)
            cpu = time.process_time() - cpu0
            s = llm.stats()
            row = res.summary()
            runs[cfg["config"]].append(
                dict(
                    row,
                    cpu_s=cpu,
                    kv_blocks=llm.engine.runner.num_blocks,
                    offloaded=s.kv_offloaded_tokens,
                    reloaded=s.kv_reloaded_tokens,
                    recomputed=s.kv_recomputed_tokens,
                    host_hit_rate=s.host_hit_rate,
                    preemptions=s.preemptions,
                )
            )
            del llm, res
            release()
    out = []
    for name, rs in runs.items():
        walls = [r["elapsed_s"] for r in rs]
        first = rs[0]
        out.append(
            {
                "workload": work.name,
                "config": name,
                "kv_blocks": first["kv_blocks"],
                "computed_prompt_tokens": first["computed_prompt_tokens"],
                "computed/distinct": first["computed_prompt_tokens"] / distinct,
                "offloaded": first["offloaded"],
                "reloaded": first["reloaded"],
                "recomputed": first["recomputed"],
                "host_hit_rate": first["host_hit_rate"],
                "preemptions": first["preemptions"],
                "wall_min_s": min(walls),
                "wall_median_s": statistics.median(walls),
                "cpu_s": statistics.median(r["cpu_s"] for r in rs),
                "output_tok_s": max(r["output_tok_s"] for r in rs),
                "walls": walls,
            }
        )
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    ap.add_argument("--workloads", default="labeling,long,short")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies the labeling lengths")
    ap.add_argument("--long-scale", type=float, default=1.0, help="multiplies the long-document lengths")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--host-gb", type=float, default=1.0)
    ap.add_argument("--pool-frac", type=float, default=0.25, help="device pool / working set (labeling)")
    args = ap.parse_args(argv)
    setup_threads(args.threads, args.device)
    bm = build_model(args.preset, args.device, args.dtype)
    bs, host = args.block_size, int(args.host_gb * 2**30)
    base = dict(block_size=bs, max_num_batched_tokens=4096)
    results = []
    load_before = os.getloadavg()
    for name in args.workloads.split(","):
        if name == "labeling":
            work = pw.labeling(bm.vocab_size, 64, 16, 1000, 100, 8, args.scale, seed=0)
            pool = pool_blocks(work, bs, args.pool_frac)
            cfgs = [
                dict(config="recompute", ordering="fifo", num_kv_blocks=pool, **base),
                dict(config="host tier", ordering="fifo", num_kv_blocks=pool, kv_offload_bytes=host, **base),
            ]
        elif name == "long":
            work = long_docs(
                bm.vocab_size, 32, round(2000 * args.long_scale), round(4000 * args.long_scale), 160, seed=1
            )
            longest = max(map(len, work.prompts)) + 160
            pool = 3 * -(-longest // bs)  # about three long documents at once
            cfgs = [
                dict(config="recompute", ordering="fifo", num_kv_blocks=pool, max_num_seqs=32, **base),
                dict(
                    config="host tier",
                    ordering="fifo",
                    num_kv_blocks=pool,
                    max_num_seqs=32,
                    kv_offload_bytes=host,
                    **base,
                ),
            ]
        elif name == "short":
            work = pw.labeling(bm.vocab_size, 8, 64, 60, 40, 4, 1.0, seed=2)
            cfgs = [
                dict(config="block-granular", share_partial_blocks=False, **base),
                dict(config="token-granular", share_partial_blocks=True, **base),
            ]
        else:
            raise SystemExit(f"unknown workload {name!r}; choose from labeling, long, short")
        results += run_pair(bm, work, cfgs, args.repeats)
        print_table(results[-2:], COLUMNS, title=f"{name}: {work.describe()}")
    result = {
        "benchmark": "kv_hierarchy_bench",
        "args": vars(args),
        "environment": environment(),
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "runs": results,
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
