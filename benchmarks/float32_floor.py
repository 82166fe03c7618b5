"""How far any engine could get past transformers on a float32 CPU (issue 24, goal 2): a floor, measured.

Why: on a CPU without native bf16 both engines run the prompts' products on the same float32 sgemm
near the FMA peak, so a ratio over transformers is bounded by the work both must do. Per (threads,
batch), in one process, rounds interleaved, the embedded SmolLM2 and benchmarks/cpu_path.py's workload
(random prompts of ``--prompt-len`` tokens, greedy, EOS ignored, prefix caching off):
- ``hf``, ``pf``: transformers ``generate`` and the prefixflow default, ``--max-tokens`` new tokens;
- ``hf-prefill``, ``pf-prefill``: the same with 1 new token (the prompts and the first token);
- the float32 matmul ceiling (benchmarks/roofline.py) at that thread count.

``floor_s`` = the faster engine's prefill (median) + the decode steps' products (2 x parameters per
generated token after the first, the LM head included) at the ceiling, with nothing else in a decode
step costing anything; ``best_ratio`` = transformers' median / ``floor_s``, the most any float32 engine
could run ahead of it on this work; ``peak_ratio`` the same with the prompts' products at the ceiling
too (no attention, no norms: a looser bound).

    python -m benchmarks.float32_floor --threads 1,2 --batches 16,64 --max-tokens 32 \
        --json benchmarks/results/float32_floor.json

On an AVX2 host emulated on an AVX-512 one: ``MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2
ONEDNN_MAX_CPU_ISA=AVX2 PREFIXFLOW_NATIVE_MARCH=haswell`` before the command.
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

import torch

from benchmarks.common import environment, print_table, write_json
from benchmarks.cpu_path import load_hf, load_pf, matmul_flops, prompts, run_hf, run_pf

SIDES = ("hf", "pf", "hf-prefill", "pf-prefill")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--batches", default="16,64")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from benchmarks.roofline import measure_ceilings

    threads = [int(t) for t in args.threads.split(",")]
    batches = [int(b) for b in args.batches.split(",")]
    pf = load_pf("pf-default", kv_tokens=max(batches) * (args.prompt_len + args.max_tokens))
    hf = load_hf(torch.float32)
    vocab = 49152
    runs: list[dict[str, Any]] = []
    ceilings: dict[int, float] = {}
    for t in threads:
        torch.set_num_threads(t)
        ceilings[t] = measure_ceilings("cpu", torch.float32).flops_per_s
        for b in batches:
            for r in range(args.rounds):
                batch = prompts(b, args.prompt_len, vocab, seed=1000 * r + b)
                for side in SIDES:
                    new = 1 if side.endswith("prefill") else args.max_tokens
                    m = run_hf(hf, batch, new) if side.startswith("hf") else run_pf(pf, batch, new)
                    m.update(side=side, threads=t, batch=b, round=r, load_average=os.getloadavg()[0])
                    runs.append(m)
                    print(
                        f"t{t} b{b:3d} r{r} {side:10s} wall {m['wall_s']:7.2f}s cpu {m['cpu_s']:7.2f}s",
                        flush=True,
                    )
    rows = summarize(runs, threads, batches, args.prompt_len, args.max_tokens, ceilings)
    print_table(
        rows,
        [
            "threads",
            "batch",
            "hf_s",
            "pf_s",
            "ratio",
            "prefill_s",
            "decode_peak_s",
            "floor_s",
            "best_ratio",
            "peak_ratio",
        ],
    )
    result = {
        "environment": environment(),
        "args": vars(args),
        "ceilings": ceilings,
        "runs": runs,
        "rows": rows,
    }
    if args.json:
        write_json(args.json, result)
    return result


def summarize(
    runs: list[dict[str, Any]],
    threads: list[int],
    batches: list[int],
    prompt_len: int,
    max_tokens: int,
    ceilings: dict[int, float],
) -> list[dict[str, Any]]:
    """Medians per side and the floor of each (threads, batch)."""
    rows = []
    for t in threads:
        for b in batches:
            med = {
                s: statistics.median(
                    m["wall_s"] for m in runs if (m["side"], m["threads"], m["batch"]) == (s, t, b)
                )
                for s in SIDES
            }
            prefill = min(med["hf-prefill"], med["pf-prefill"])
            decode_flops = matmul_flops(prompt_len, max_tokens, b) - matmul_flops(prompt_len, 1, b)
            decode_peak = decode_flops / ceilings[t]
            floor = prefill + decode_peak
            peak = matmul_flops(prompt_len, max_tokens, b) / ceilings[t]
            rows.append(
                {
                    "threads": t,
                    "batch": b,
                    "hf_s": round(med["hf"], 2),
                    "pf_s": round(med["pf"], 2),
                    "ratio": round(med["hf"] / med["pf"], 3),
                    "prefill_s": round(prefill, 2),
                    "decode_peak_s": round(decode_peak, 2),
                    "floor_s": round(floor, 2),
                    "best_ratio": round(med["hf"] / floor, 3),
                    "peak_ratio": round(med["hf"] / peak, 3),
                    "load_average": round(max(m["load_average"] for m in runs if m["threads"] == t), 2),
                }
            )
    return rows


if __name__ == "__main__":
    main()
