"""Where the CPU default path's time goes (issue 24): torch.profiler over one ``generate`` at batch 1/16/64.

Embedded SmolLM2 as a newcomer loads it, 1 thread, prompts of ``--prompt-len`` random tokens,
``--max-tokens`` new tokens, prefix caching off. Operators are grouped: matmul (aten::mm/addmm/linear/
bmm), attention (the paged-attention kernels' own ops run inside ``cpu_attention``/SDPA), elementwise/
norm/rotary, and the rest; shares are of the profiled CPU self time. One warm-up call first.

    python -m benchmarks.cpu_profile --batches 1,16,64 --json benchmarks/results/cpu_profile.json
"""

from __future__ import annotations

import argparse
import os
import random
import time
from collections import defaultdict
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.common import environment, write_json

MATMUL = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear"}
# the prepacked oneDNN linear (kernels/cpu_linear.py) and FBGEMM's int8 linear (kernels/cpu_int8.py)
MATMUL_PREFIXES = ("mkldnn::_linear_pointwise", "quantized::linear")
ATTENTION = ("scaled_dot_product", "softmax", "_softmax", "aten::index_select", "aten::gather")


def group(name: str) -> str:
    if name in MATMUL or name.startswith(MATMUL_PREFIXES):
        return "matmul"
    if any(key in name for key in ATTENTION):
        return "attention (softmax, gathers)"
    if name.startswith("aten::"):
        return "other aten ops (elementwise, norms, rotary, copies)"
    return "python / engine"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", default="1,16,64")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    from prefixflow.engine import LLM, SamplingParams

    llm = LLM(
        "smollm2-135m-instruct", device="cpu", enable_prefix_caching=False, kv_cache_memory_bytes=512 << 20
    )
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([[11] * 8] * 2, SamplingParams(max_tokens=2, ignore_eos=True))
    rng = random.Random(0)
    out: dict[str, Any] = {
        "benchmark": "cpu_profile",
        "weight_path": llm.model_identity.get("weight_path"),
        "prompt_len": args.prompt_len,
        "max_tokens": args.max_tokens,
        "threads": args.threads,
        "batches": {},
        "load_average_before": os.getloadavg(),
    }
    for b in (int(x) for x in args.batches.split(",")):
        prompts = [[rng.randrange(10, 49000) for _ in range(args.prompt_len)] for _ in range(b)]
        before = llm.stats().steps, llm.stats().host_s
        wall, cpu = time.perf_counter(), time.process_time()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            llm.generate(prompts, params)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        steps, host = llm.stats().steps - before[0], llm.stats().host_s - before[1]
        totals: dict[str, float] = defaultdict(float)
        ops = []
        for evt in prof.key_averages():
            totals[group(evt.key)] += evt.self_cpu_time_total
            ops.append((evt.self_cpu_time_total, evt.key, evt.count))
        profiled = sum(totals.values()) or 1.0
        top = sorted(ops, reverse=True)[:12]
        out["batches"][str(b)] = {
            "wall_s": wall,
            "cpu_s": cpu,
            "steps": steps,
            "host_ms_per_step": 1000 * host / max(steps, 1),
            "shares": {k: round(v / profiled, 3) for k, v in sorted(totals.items(), key=lambda kv: -kv[1])},
            "top_ops": [
                {"op": k, "self_ms": round(t / 1000, 1), "calls": n, "share": round(t / profiled, 3)}
                for t, k, n in top
            ],
        }
        print(
            f"batch {b}: wall {wall:.2f} s, cpu {cpu:.2f} s, {steps} steps, host {1000 * host / max(steps, 1):.2f} ms/step"
        )
        for k, v in out["batches"][str(b)]["shares"].items():
            print(f"  {v:6.1%}  {k}")
        for row in out["batches"][str(b)]["top_ops"][:8]:
            print(f"    {row['share']:6.1%}  {row['op']}  ({row['calls']} calls)")
    out["load_average_after"] = os.getloadavg()
    out["environment"] = environment()
    if args.json:
        write_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
