"""Prefix sharing side by side (issue 4): prefix ordering + cache vs fifo + cache vs no cache, then the
same under a KV pool smaller than the working set (eviction).

    python -m benchmarks.prefix_bench --scale 0.25 --num-prefixes 8 --num-docs 32      # CPU, tiny
    python -m benchmarks.prefix_bench --preset llama-3.1-8b                           # GPU, full size

computed/distinct = prompt tokens the engine computed / nodes of the prompts' token trie (goal <= 1.05
with prefix ordering); computed/block_min divides by the least a 16-token-block cache can compute.
"""

from __future__ import annotations

import argparse
import math
import random
import sys
from collections.abc import Sequence

from benchmarks import prefix_workloads as pw
from benchmarks.common import (
    BenchModel,
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
    "config",
    "kv_blocks",
    "computed_prompt_tokens",
    "computed/distinct",
    "computed/block_min",
    "prefix_hit_rate",
    "preemptions",
    "elapsed_s",
    "output_tok_s",
    "total_tok_s",
]


def configs(small_pool_blocks: int) -> list[dict]:
    """The runs, each a name plus engine options."""
    return [
        {"config": "prefix+cache", "ordering": "prefix", "enable_prefix_caching": True},
        {"config": "fifo+cache", "ordering": "fifo", "enable_prefix_caching": True},
        {"config": "no-cache", "ordering": "fifo", "enable_prefix_caching": False},
        {
            "config": "prefix+cache small-pool",
            "ordering": "prefix",
            "enable_prefix_caching": True,
            "num_kv_blocks": small_pool_blocks,
        },
        {
            "config": "fifo+cache small-pool",
            "ordering": "fifo",
            "enable_prefix_caching": True,
            "num_kv_blocks": small_pool_blocks,
        },
    ]


def small_pool(work: pw.Workload, block_size: int, frac: float) -> int:
    """``frac`` of the trie's blocks, but room for at least four of the longest requests."""
    longest = max(len(p) + n for p, n in zip(work.prompts, work.max_tokens))
    floor = 4 * math.ceil(longest / block_size)
    return max(floor, math.ceil(frac * pw.distinct_prefix_tokens(work.prompts) / block_size))


def run_workload(
    bm: BenchModel,
    work: pw.Workload,
    engine_kw: dict,
    small_pool_blocks: int | None,
    small_pool_frac: float,
    only: Sequence[str] | None = None,
) -> dict:
    """All configs on one workload; returns the workload's description and one row per config."""
    bs = engine_kw.get("block_size", 16)
    distinct = pw.distinct_prefix_tokens(work.prompts)
    block_min = pw.block_cache_min_tokens(work.prompts, bs)
    pool = small_pool_blocks or small_pool(work, bs, small_pool_frac)
    rng = random.Random(12345)
    warm = [random_tokens(rng, 8, bm.vocab_size) for _ in range(2)]
    rows = []
    for cfg in configs(pool):
        if only and cfg["config"] not in only:
            continue
        opts = {k: v for k, v in cfg.items() if k != "config"}
        llm = make_llm(bm, **(engine_kw | opts))
        run_prefixflow(llm, warm, [2, 2])
        res = run_prefixflow(llm, work.prompts, work.max_tokens)
        row = res.summary()
        computed = row["computed_prompt_tokens"]
        row.update(
            config=cfg["config"],
            kv_blocks=llm.engine.runner.num_blocks,
            **{"computed/distinct": computed / distinct, "computed/block_min": computed / block_min},
        )
        rows.append(row)
        del llm, res
        release()
    desc = work.describe() | {"block_cache_min_tokens": block_min, "small_pool_blocks": pool}
    return {"workload": desc, "runs": rows}


def build_workloads(args, vocab_size: int) -> list[pw.Workload]:
    out = []
    for name in args.workloads.split(","):
        if name == "labeling":
            out.append(
                pw.labeling(
                    vocab_size,
                    args.num_prefixes,
                    args.num_docs,
                    args.prefix_len,
                    args.doc_len,
                    args.output_len,
                    args.scale,
                    args.seed,
                )
            )
        elif name == "chat":
            out.append(
                pw.chat(
                    vocab_size,
                    args.conversations,
                    args.turns,
                    scale=args.scale,
                    seed=args.seed,
                    output_len=args.chat_output_len,
                )
            )
        else:
            raise SystemExit(f"unknown workload {name!r}; choose from labeling, chat")
    return out


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_common_args(ap)
    ap.add_argument("--workloads", default="labeling,chat")
    ap.add_argument("--scale", type=float, default=1.0, help="multiplies every prompt-part length")
    ap.add_argument("--num-prefixes", type=int, default=16)
    ap.add_argument("--num-docs", type=int, default=64)
    ap.add_argument("--prefix-len", type=int, default=1000)
    ap.add_argument("--doc-len", type=int, default=300)
    ap.add_argument("--output-len", type=int, default=8)
    ap.add_argument("--conversations", type=int, default=32)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--chat-output-len", type=int, default=32)
    ap.add_argument("--block-size", type=int, default=16)
    ap.add_argument("--max-num-seqs", type=int, default=256)
    ap.add_argument("--max-num-batched-tokens", type=int, default=4096)
    ap.add_argument("--num-kv-blocks", type=int, default=None, help="KV pool of the ample-pool runs")
    ap.add_argument("--small-pool-blocks", type=int, default=None, help="KV blocks of the eviction runs")
    ap.add_argument(
        "--small-pool-frac", type=float, default=0.1, help="else this fraction of the trie's blocks"
    )
    ap.add_argument("--configs", default=None, help="comma list of configs to run (default: all)")
    args = ap.parse_args(argv)
    setup_threads(args.threads, args.device)

    bm = build_model(args.preset, args.device, args.dtype, args.seed)
    engine_kw = {
        "block_size": args.block_size,
        "max_num_seqs": args.max_num_seqs,
        "max_num_batched_tokens": args.max_num_batched_tokens,
    }
    if args.num_kv_blocks:
        engine_kw["num_kv_blocks"] = args.num_kv_blocks
    results = []
    for work in build_workloads(args, bm.vocab_size):
        only = args.configs.split(",") if args.configs else None
        res = run_workload(bm, work, engine_kw, args.small_pool_blocks, args.small_pool_frac, only)
        d = res["workload"]
        title = (
            f"{work.name}: {d['requests']} requests, {d['prompt_tokens']} prompt tokens, "
            f"{d['distinct_prefix_tokens']} distinct (trie), block-cache minimum {d['block_cache_min_tokens']}, "
            f"small pool {d['small_pool_blocks']} blocks"
        )
        print_table(res["runs"], COLUMNS, title=title)
        results.append(res)
    result = {
        "benchmark": "prefix_bench",
        "preset": args.preset,
        "device": bm.device.type,
        "dtype": str(bm.dtype).removeprefix("torch."),
        "engine": engine_kw,
        "workloads": results,
        "environment": environment(),
    }
    write_json(args.json, result)
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
