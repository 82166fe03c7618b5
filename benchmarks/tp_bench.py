"""Tensor parallelism: one engine on N ranks against one rank, same weights, same prompts (issue 13).

    python -m benchmarks.tp_bench --preset llama-3.2-1b --tp 2 --threads 2 --repeats 2     # CPU, gloo
    python -m benchmarks.tp_bench --preset llama-3.1-8b --tp 2 --device cuda --num-prompts 256 \\
        --prompt-len 512 --max-tokens 128                                                # 2+ GPUs, NCCL

The model is the preset materialized as a Hugging Face directory (worker processes load it from
disk; an in-memory model cannot be shared), greedy, EOS ignored. Runs alternate A B A B, each on a
freshly loaded engine (so no run sees another's prefix cache). On CPU the cores are split fairly:
TP=1 gets ``--threads`` torch threads, each of the N ranks gets ``threads / N``. Reported per run:
output and total tokens/s, steps, and the time inside all-reduces per step: rank 0's (an all-reduce
returns when the slowest rank has contributed, so this includes waiting for the other rank) and the
fastest rank's (closest to the cost of the communication itself).
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

import torch

from benchmarks.common import environment, print_table, write_json
from prefixflow.engine import LLM, SamplingParams

COLUMNS = [
    "run",
    "tp",
    "threads_per_rank",
    "output_tokens",
    "elapsed_s",
    "output_tok_s",
    "total_tok_s",
    "steps",
    "all_reduce_ms_per_step",
    "all_reduce_ms_per_step_fastest_rank",
    "all_reduces_per_step",
    "gather_ms_per_step",
]


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, vocab) for _ in range(length)] for _ in range(n)]


def one_run(
    model: str, tp: int, threads: int, device: str, work: list[list[int]], max_tokens: int, options: dict
) -> tuple[dict, list[list[int]]]:
    per_rank = max(1, threads // tp) if device == "cpu" else threads
    torch.set_num_threads(per_rank)  # rank 0 here; workers inherit this count
    with LLM(model, device=device, tensor_parallel_size=tp, **options) as llm:
        llm.generate(work[:1], SamplingParams(max_tokens=2, ignore_eos=True))  # warm-up (untimed)
        runner = llm.engine.runner
        before = llm.stats().steps
        stats_before = runner.collective_stats()
        start = time.perf_counter()
        outs = llm.generate(work, SamplingParams(max_tokens=max_tokens, ignore_eos=True))
        elapsed = time.perf_counter() - start
        steps = llm.stats().steps - before
        out_tokens = sum(o.num_output_tokens for o in outs)
        prompt_tokens = sum(len(p) for p in work)
        row = {
            "tp": tp,
            "threads_per_rank": per_rank,
            "output_tokens": out_tokens,
            "elapsed_s": elapsed,
            "output_tok_s": out_tokens / elapsed,
            "total_tok_s": (out_tokens + prompt_tokens) / elapsed,
            "steps": steps,
            "all_reduce_ms_per_step": 0.0,
            "all_reduce_ms_per_step_fastest_rank": 0.0,
            "all_reduces_per_step": 0.0,
            "gather_ms_per_step": 0.0,
        }
        stats_after = runner.collective_stats()
        if stats_before is not None and stats_after is not None:
            delta = (
                stats_after - stats_before
            ) / steps  # per rank: all-reduce s, calls, gather s, broadcast s
            row["all_reduce_ms_per_step"] = 1000 * float(delta[0, 0])  # rank 0: includes waiting for rank 1
            row["all_reduce_ms_per_step_fastest_rank"] = 1000 * float(delta[:, 0].min())
            row["all_reduces_per_step"] = float(delta[0, 1])
            row["gather_ms_per_step"] = 1000 * float(delta[0, 2])
        return row, [list(o.token_ids) for o in outs]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--tp", type=int, default=2, help="tensor_parallel_size of run B (run A: 1)")
    ap.add_argument("--device", default="cpu", help="cpu (gloo) | cuda (NCCL, needs --tp GPUs)")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="CPU threads shared by the ranks"
    )
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=2, help="A B pairs, interleaved")
    ap.add_argument(
        "--single-thread-peer",
        action="store_true",
        help="also run C: TP=1 on one thread (on a loaded host, OpenMP threads can cost more than they give)",
    )
    ap.add_argument("--kv-cache-mib", type=int, default=256)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)

    from prefixflow.engine.loading.presets import load_preset, materialize

    model = str(materialize(args.preset))
    vocab = int(load_preset(args.preset)["vocab_size"])
    work = prompts(args.num_prompts, args.prompt_len, vocab, seed=0)
    options = {"dtype": args.dtype, "max_num_seqs": args.num_prompts, "enable_prefix_caching": False}
    if args.device == "cpu":
        options["kv_cache_memory_bytes"] = args.kv_cache_mib * 2**20
    rows, tokens, loads = [], {}, []
    configs = [("A", 1, args.threads), ("B", args.tp, args.threads)]
    if args.single_thread_peer:
        configs.append(("C", 1, 1))
    for i in range(args.repeats):
        for label, tp, threads in configs:
            loads.append(os.getloadavg()[0])
            row, toks = one_run(model, tp, threads, args.device, work, args.max_tokens, options)
            rows.append({"run": f"{i + 1}{label}", **row})
            tokens.setdefault(label, toks)
            print_table(rows[-1:], COLUMNS)
            sys.stdout.flush()
    summary = {}
    for label, tp, threads in configs:
        rates = [r["output_tok_s"] for r in rows if r["run"].endswith(label)]
        totals = [r["total_tok_s"] for r in rows if r["run"].endswith(label)]
        summary[label] = {
            "tp": tp,
            "threads": threads,
            "output_tok_s_min": min(rates),
            "output_tok_s_median": statistics.median(rates),
            "total_tok_s_median": statistics.median(totals),
        }
    same = all(t == tokens["A"] for t in tokens.values())
    print_table(rows, COLUMNS, title=f"{args.preset}: TP=1 vs TP={args.tp} on {args.device}")
    print(f"greedy tokens identical: {same}; load average during runs: {loads}")
    write_json(
        args.json,
        {
            "benchmark": "tp_bench",
            "args": vars(args),
            "environment": environment(),
            "rows": rows,
            "summary": summary,
            "greedy_identical": same,
            "load_average_per_run": loads,
        },
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
