"""Norm, rotary and SiLU-and-mul per call: the torch ops (kernels/cpu_ops.py) against the native
kernels (kernels/cpu_native_ops.py), issue 24.

Per op and row count: process CPU microseconds per call on SmolLM2-135M's widths (hidden 576, 9 query
and 3 KV heads of 64, intermediate 1,536), bf16, the two interleaved A B A B, min and median over
``--rounds`` rounds of ``--calls`` calls each (SiLU-and-mul times a copy of its input too, on both
sides: the torch op works in place). A step of the engine makes 30 such calls per op.

    python -m benchmarks.cpu_elementwise_ab --threads 1,2
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import torch

from prefixflow.kernels import cpu_native_ops, cpu_ops

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE = 576, 9, 3, 64, 1536
BF16 = torch.bfloat16


def cases(rows: int) -> dict[str, tuple[Callable[[], object], Callable[[], object]]]:
    """Per op, (torch call, native call) on the same inputs."""
    gen = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, HIDDEN, generator=gen).to(BF16)
    residual = torch.randn(rows, HIDDEN, generator=gen).to(BF16)
    weight = (1 + 0.1 * torch.randn(HIDDEN, generator=gen)).to(BF16)
    q = torch.randn(rows, Q_HEADS, HEAD_DIM, generator=gen).to(BF16)
    k = torch.randn(rows, KV_HEADS, HEAD_DIM, generator=gen).to(BF16)
    positions = torch.randint(0, 2048, (rows,), generator=gen)
    inv = 1.0 / (10000 ** (torch.arange(0, HEAD_DIM, 2).float() / HEAD_DIM))
    freqs = torch.outer(torch.arange(2048).float(), inv)
    cos_sin = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    gate_up = torch.randn(rows, 2 * INTERMEDIATE, generator=gen).to(BF16)
    return {
        "rms_norm+residual": (
            lambda: cpu_ops.rms_norm(x, weight, 1e-5, residual),
            lambda: cpu_native_ops.rms_norm(x, weight, 1e-5, residual),
        ),
        "rotary": (
            lambda: cpu_ops.rotary(q, k, positions, cos_sin),
            lambda: cpu_native_ops.rotary(q, k, positions, cos_sin),
        ),
        "silu_and_mul": (
            lambda: cpu_ops.silu_and_mul(gate_up.clone()),
            lambda: cpu_native_ops.silu_and_mul(gate_up.clone()),
        ),
    }


def cpu_us_per_call(fn: Callable[[], object], calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn()
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--rows", default="1,16,64")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    if not cpu_native_ops.available():
        raise SystemExit("the native elementwise kernels are not built here (a C compiler is needed)")
    print(f"torch {torch.__version__}, load average before {os.getloadavg()[0]:.2f}")
    print("threads  rows  op                  torch us (min/median)  native us (min/median)  torch/native")
    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for rows in (int(r) for r in args.rows.split(",")):
            for name, (torch_call, native_call) in cases(rows).items():
                torch_call(), native_call()  # warm: build, caches, thread pool
                old: list[float] = []
                new: list[float] = []
                for _ in range(args.rounds):
                    old.append(cpu_us_per_call(torch_call, args.calls))
                    new.append(cpu_us_per_call(native_call, args.calls))
                ratio = statistics.median(old) / statistics.median(new)
                print(
                    f"{threads:7d}  {rows:4d}  {name:18s}  {min(old):8.1f} / {statistics.median(old):8.1f}"
                    f"      {min(new):8.1f} / {statistics.median(new):8.1f}     {ratio:5.2f}x"
                )
    print(f"load average after {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
