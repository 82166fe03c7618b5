"""2:4 sparse vs dense on the GPU (issue 29), owed to a CUDA SM >= 8.0 machine:

1. GEMM: one Llama-3.1-8B decoder layer's four GEMMs (qkv 4096->6144, o 4096->4096, gate|up
   4096->28672, down 14336->4096), bf16, ``F.linear(x, W)`` dense against ``F.linear(x, W_sparse)`` with
   ``W_sparse = torch.sparse.to_sparse_semi_structured(W)`` (the engine's kernel), at M = 16 ... 8192
   tokens; also the largest |difference| of the outputs relative to their scale (a correctness guard).
2. End to end, prefill-heavy: a random-weight preset (default llama-3.2-1b) with 1,024-token prompts and
   one output token, dense against ``sparsity="2:4"``, tokens/s of prefill.
Times are medians of ``triton.testing.do_bench`` (GEMM) and the best of two timed runs (end to end).

Run: PYTHONPATH=. python benchmarks/sparse24_gpu_bench.py [--json out.json]; without CUDA it says so, exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

LAYER = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N) per GEMM
MS = (16, 64, 256, 1024, 4096, 8192)


def bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median"))


def gemm_rows() -> list[dict]:
    from torch.sparse import to_sparse_semi_structured

    from prefixflow.engine.quantization.sparse24 import prune_24

    dense = [prune_24(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.02) for k, n in LAYER]
    sparse = [to_sparse_semi_structured(w) for w in dense]
    rows = []
    for m in MS:
        xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k, _ in LAYER]
        d = bench_ms(lambda xs=xs: [torch.nn.functional.linear(x, w) for x, w in zip(xs, dense)])
        s = bench_ms(lambda xs=xs: [torch.nn.functional.linear(x, w) for x, w in zip(xs, sparse)])
        err = max(
            float(
                (torch.nn.functional.linear(x, ws).float() - torch.nn.functional.linear(x, wd).float())
                .abs()
                .max()
                / torch.nn.functional.linear(x, wd).float().abs().max()
            )
            for x, wd, ws in zip(xs, dense, sparse)
        )
        rows.append({"m": m, "dense_ms": d, "sparse_ms": s, "speedup": d / s, "max_rel_diff": err})
        print(
            f"M={m:5d} dense {d:8.3f} ms  2:4 {s:8.3f} ms  {d / s:5.2f}x  max rel diff {err:.1e}", flush=True
        )
    return rows


def end_to_end(preset: str, prompts: int, length: int) -> dict:
    from prefixflow.engine import LLM, SamplingParams

    ids = [[(7 * i + 13 * j) % 30000 + 10 for j in range(length)] for i in range(prompts)]
    params = SamplingParams(max_tokens=1, ignore_eos=True)
    out = {}
    for name, opts in (("dense", {}), ("sparse24", {"sparsity": "2:4"})):
        llm = LLM(preset, dtype="bfloat16", device="cuda", enable_prefix_caching=False, **opts)
        kernels = llm.engine.model_identity["quantization"].get("sparsity", {}).get("kernel", "dense")
        llm.generate(ids[:4], params)  # warm-up
        best = float("inf")
        for _ in range(2):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            llm.generate(ids, params)
            torch.cuda.synchronize()
            best = min(best, time.perf_counter() - t0)
        out[name] = {"prefill_tok_s": prompts * length / best, "seconds": best, "kernel": kernels}
        print(name, out[name], flush=True)
        del llm
        torch.cuda.empty_cache()
    out["speedup"] = out["sparse24"]["prefill_tok_s"] / out["dense"]["prefill_tok_s"]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    ap.add_argument("--preset", default="llama-3.2-1b")
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--length", type=int, default=1024)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("no CUDA device: the 2:4 GPU benchmark is owed to a CUDA SM >= 8.0 machine")
        return 0
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "gemm": gemm_rows(),
        "end_to_end": end_to_end(args.preset, args.prompts, args.length),
    }
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
