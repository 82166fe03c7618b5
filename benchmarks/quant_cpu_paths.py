"""Which CPU matmul a quantized linear layer should use (issue 12): one layer, every path, side by side.

``kernels.quant_cpu.select_cpu_kernel`` picks the CPU kernel for a packed weight from this
measurement. Paths, for activations of ``M`` rows against a ``[N, K]`` weight quantized as the
engine's on-the-fly methods do (int8 per channel, int4 groups of 128):

- ``dense``: the full-precision ``x @ w.T`` (what ``quantization="none"`` runs);
- ``cpu-dequant``: ``DequantChunks`` (a few hundred rows dequantized at a time, float32 arithmetic);
- ``cpu-int8pack`` / ``cpu-int4pack``: torch's ``_weight_int8pack_mm`` / ``_weight_int4pack_mm_for_cpu``.

Each in float32 and bfloat16 activations. Rounds are interleaved (every path once per round), one
torch thread; min and median milliseconds per call are reported with the load average.

    python -m benchmarks.quant_cpu_paths --json benchmarks/results/cpu_quant_paths.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from benchmarks.common import environment, print_table, write_json
from prefixflow.engine.quantization.online import INT4_GROUP, quantize_int4, quantize_int8
from prefixflow.kernels.quant_cpu import DequantChunks, Int4Pack, Int8Pack
from prefixflow.kernels.quant_weight import PackedWeight, pack_along_rows

# (name, K, N): SmolLM2-135M's gate_up, llama-3.2-1b's down_proj
SHAPES = [("smollm2 gate_up", 576, 3072), ("llama-3.2-1b down", 8192, 2048)]
COLUMNS = ["shape", "m", "path", "dtype", "ms_min", "ms_median", "vs_dense_same_dtype"]


def packed(w: torch.Tensor, bits: int) -> PackedWeight:
    k = w.shape[1]
    if bits == 8:
        q, s = quantize_int8(w)
        return PackedWeight(pack_along_rows(q.t().contiguous(), 8), s[None, :], 8, k, k)
    q, s, z = quantize_int4(w)
    return PackedWeight(
        pack_along_rows(q.t().contiguous(), 4), s.t().contiguous(), 4, k, INT4_GROUP, z.t().contiguous()
    )


def paths(w: torch.Tensor) -> dict[tuple[str, str], Callable[[torch.Tensor], torch.Tensor]]:
    out: dict[tuple[str, str], Callable[[torch.Tensor], torch.Tensor]] = {}
    w8, w4 = packed(w, 8), packed(w, 4)
    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).removeprefix("torch.")
        dense = w.to(dtype)
        out[("dense", name)] = lambda x, d=dense: x @ d.t()
        out[("int8 cpu-dequant", name)] = DequantChunks(w8, dtype)
        out[("int8 cpu-int8pack", name)] = Int8Pack(w8, dtype)
        out[("int4 cpu-dequant", name)] = DequantChunks(w4, dtype)
        out[("int4 cpu-int4pack", name)] = Int4Pack(w4, dtype)
    return out


def time_call(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, repeats: int) -> float:
    fn(x)  # warm-up (first call may pack or allocate)
    start = time.perf_counter()
    for _ in range(repeats):
        fn(x)
    return (time.perf_counter() - start) / repeats * 1000


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ms", default="1,16,64")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    load_before = os.getloadavg()
    rows = []
    for shape, k, n in SHAPES:
        w = torch.randn(n, k) * 0.02
        fns = paths(w)
        for m in (int(v) for v in args.ms.split(",")):
            xs = {d: torch.randn(m, k).to(getattr(torch, d)) for d in ("float32", "bfloat16")}
            times: dict[tuple[str, str], list[float]] = {key: [] for key in fns}
            for _ in range(args.rounds):
                for key, fn in fns.items():
                    times[key].append(time_call(fn, xs[key[1]], args.repeats))
            for (path, dtype), t in times.items():
                base = statistics.median(times[("dense", dtype)])
                rows.append(
                    {
                        "shape": f"{shape} {k}x{n}",
                        "m": m,
                        "path": path,
                        "dtype": dtype,
                        "ms_min": round(min(t), 3),
                        "ms_median": round(statistics.median(t), 3),
                        "vs_dense_same_dtype": round(statistics.median(t) / base, 2),
                    }
                )
            print(f"{shape} m={m} done", flush=True)
    print_table(rows, COLUMNS)
    result = {
        "benchmark": "quant_cpu_paths",
        "rounds": args.rounds,
        "repeats": args.repeats,
        "rows": rows,
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
        "environment": environment(),
    }
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
