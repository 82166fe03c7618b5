"""Roofline lower bound for an offline generation job, from a model shape, a workload and ceilings
measured on this machine in the same run. The cost model itself (ModelShape, job_cost,
lower_bound_seconds) lives in prefixflow.pipeline.advisor.roofline, torch-free, so that
`prefixflow plan --advise` can use it; this module re-exports it and adds the measurement.

bound = max(total FLOPs / peak FLOP/s, total bytes / copy bandwidth); what is counted is described there.

Run: PYTHONPATH=. python benchmarks/roofline.py --model llama-3.1-8b --workload varied
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from prefixflow.pipeline.advisor.roofline import (
    Ceilings,
    JobCost,
    ModelShape,
    Workload,
    job_cost,
    lower_bound_seconds,
)

__all__ = [
    "Ceilings",
    "JobCost",
    "ModelShape",
    "Workload",
    "job_cost",
    "load_shape",
    "lower_bound_seconds",
    "measure_ceilings",
    "parse_workload",
    "varied_workload",
]

REPO = Path(__file__).resolve().parents[1]
MODELS_DIR = REPO / "configs" / "models"
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}


def load_shape(model: str) -> ModelShape:
    """A preset name under configs/models/ (e.g. "llama-3.1-8b"), or a path to a config.json / HF dir."""
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if not path.exists():
        path = MODELS_DIR / f"{model}.json"
    return ModelShape.from_config(json.loads(path.read_text()))


def varied_workload(n: int = 256, lo: int = 100, hi: int = 1024, seed: int = 0) -> list[tuple[int, int]]:
    """The `varied` benchmark: prompt and output lengths uniform in [lo, hi]."""
    rng = random.Random(seed)
    return [(rng.randint(lo, hi), rng.randint(lo, hi)) for _ in range(n)]


def parse_workload(spec: str) -> list[tuple[int, int]]:
    """ "varied", "varied:N", "fixed:N" (1024 in / 1024 out), "fixed:N:P:O" or a JSON file of pairs."""
    kind, *nums = spec.split(":")
    if kind == "varied":
        return varied_workload(int(nums[0]) if nums else 256)
    if kind == "fixed":
        n, p, o = (
            (int(nums[0]), *(int(x) for x in nums[1:3])) if len(nums) == 3 else (int(nums[0]), 1024, 1024)
        )
        return [(p, o)] * n
    return [(int(p), int(o)) for p, o in json.loads(Path(spec).read_text())]


def _timed(fn, device: torch.device, repeats: int) -> float:
    """Best wall time of `fn` over `repeats` runs after one warm-up, synchronising CUDA."""
    fn()
    best = math.inf
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    return best


def _copy_seconds(nbytes: int, device: torch.device) -> float:
    """Best time to copy nbytes device-to-device (buffers freed on return)."""
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).uniform_()
    dst = torch.empty_like(src)
    return _timed(lambda: dst.copy_(src), device, repeats=10)


def measure_ceilings(device: str | torch.device = "auto", dtype: torch.dtype | None = None) -> Ceilings:
    """Copy bandwidth of a large device-to-device copy and the rate of a large square matmul.

    CUDA: 2 GiB copy, bf16 8192^3 matmul. CPU: float32, sized to finish in about a second.
    """
    if str(device) == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    on_gpu = device.type == "cuda"
    dtype = dtype or (torch.bfloat16 if on_gpu else torch.float32)

    copy_bytes = (2 << 30) if on_gpu else (128 << 20)
    copy_s = _copy_seconds(copy_bytes, device)

    n = 8192 if on_gpu else 1024
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    mm_s = _timed(lambda: a @ b, device, repeats=10 if on_gpu else 3)
    return Ceilings(
        bytes_per_s=2 * copy_bytes / copy_s,
        flops_per_s=2 * n**3 / mm_s,
        device=torch.cuda.get_device_name(device) if on_gpu else "cpu",
        dtype=str(dtype).removeprefix("torch."),
    )


def main(argv: Sequence[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--model", default="llama-3.1-8b", help="preset name under configs/models or a config path"
    )
    ap.add_argument(
        "--workload", default="varied", help='"varied", "varied:N", "fixed:N", "fixed:N:P:O" or a JSON file'
    )
    ap.add_argument("--device", default="auto")
    ap.add_argument(
        "--dtype", default=None, help="weights/KV dtype (default bfloat16 on CUDA, float32 on CPU)"
    )
    ap.add_argument("--max-tokens-per-step", type=int, default=None)
    ap.add_argument("--json", default=None, help="also write the result here")
    args = ap.parse_args(argv)

    shape = load_shape(args.model)
    workload = parse_workload(args.workload)
    dtype = getattr(torch, args.dtype) if args.dtype else None
    ceilings = measure_ceilings(args.device, dtype)
    elem = DTYPE_BYTES[ceilings.dtype]
    cost = job_cost(shape, workload, elem, elem, args.max_tokens_per_step)
    bound = lower_bound_seconds(shape, workload, ceilings, elem, elem, args.max_tokens_per_step)
    result = {
        "model": args.model,
        "workload": args.workload,
        "requests": len(workload),
        "ceilings": asdict(ceilings),
        "cost": asdict(cost),
        "compute_s": cost.flops / ceilings.flops_per_s,
        "memory_s": cost.bytes / ceilings.bytes_per_s,
        "lower_bound_s": bound,
        "bound_output_tokens_per_s": cost.output_tokens / bound,
    }
    print(
        f"device {ceilings.device} ({ceilings.dtype}): copy {ceilings.bytes_per_s / 1e9:.1f} GB/s, "
        f"matmul {ceilings.flops_per_s / 1e12:.2f} TFLOP/s"
    )
    print(
        f"model {args.model}: {shape.matmul_params / 1e6:,.1f} M matmul params, "
        f"KV {shape.kv_bytes_per_token(elem) / 1024:g} KiB/token"
    )
    print(
        f"workload {args.workload}: {len(workload)} requests, {cost.computed_tokens} computed tokens, "
        f"{cost.output_tokens} output tokens, >= {cost.steps} steps"
    )
    print(
        f"FLOPs {cost.flops / 1e12:.2f} T -> {result['compute_s']:.3f} s; bytes {cost.bytes / 1e9:.2f} GB "
        f"-> {result['memory_s']:.3f} s; lower bound {bound:.3f} s "
        f"({result['bound_output_tokens_per_s']:.0f} output tok/s)"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
