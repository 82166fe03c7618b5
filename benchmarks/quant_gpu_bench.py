"""Quantized linear layers on the GPU at Llama-3.1-8B layer shapes (issue 12 goals), one decoder layer's
four GEMMs (qkv 4096->6144, o 4096->4096, gate|up 4096->28672, down 14336->4096) timed together:

- W4A16 (Triton dequant-GEMM, int4 group 128) at batch 1, 2, 4, 8, 16: >= 2.5x the bf16 tok/s
  (a decode step's linear time, which is most of a short-context decode step);
- W4A16 at batch 256: no slower than bf16;
- fp8 W8A8 (``torch._scaled_mm``, per-token activation quantization included) at prefill, 4096 tokens:
  >= 1.5x bf16.
Also W8A16 (per-channel int8) for reference. Times are medians of ``triton.testing.do_bench``.

Run: PYTHONPATH=. python benchmarks/quant_gpu_bench.py [--json out.json]; without CUDA it says so, exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

LAYER = [(4096, 6144), (4096, 4096), (4096, 28672), (14336, 4096)]  # (K, N) per GEMM
GOALS = {"w4a16_decode": 2.5, "w4a16_b256": 1.0, "fp8_prefill": 1.5}


def bench_ms(fn) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median"))


def weights(bits: int, group: int) -> list:
    from prefixflow.engine.quantization.online import quantize_int4, quantize_int8
    from prefixflow.kernels.quant_weight import PackedWeight, pack_along_rows

    out = []
    for k, n in LAYER:
        w = torch.randn(n, k, device="cuda") * 0.02
        if bits == 4:
            codes, s, z = quantize_int4(w, group)
            out.append(
                PackedWeight(
                    pack_along_rows(codes.t(), 4), s.t().contiguous(), 4, k, group, z.t().contiguous()
                )
            )
        else:
            codes, s = quantize_int8(w)
            out.append(PackedWeight(pack_along_rows(codes.t(), 8), s[None, :].contiguous(), 8, k, k))
    return out


def layer_ms_dense(m: int) -> float:
    ws = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) for k, n in LAYER]
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k, _ in LAYER]
    return bench_ms(lambda: [torch.nn.functional.linear(x, w) for x, w in zip(xs, ws)])


def layer_ms_quant(m: int, packed: list) -> float:
    from prefixflow.kernels.triton_quant_gemm import quant_linear

    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k, _ in LAYER]
    return bench_ms(lambda: [quant_linear(x, w) for x, w in zip(xs, packed)])


def layer_ms_fp8(m: int) -> float:
    from prefixflow.engine.quantization.online import quantize_fp8
    from prefixflow.kernels.fp8_linear import Fp8Weight, fp8_linear_scaled_mm

    ws = []
    for k, n in LAYER:
        q, s = quantize_fp8(torch.randn(n, k, device="cuda") * 0.02)
        ws.append(Fp8Weight(q, s))
    xs = [torch.randn(m, k, device="cuda", dtype=torch.bfloat16) for k, _ in LAYER]
    return bench_ms(lambda: [fp8_linear_scaled_mm(x, w) for x, w in zip(xs, ws)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("quant_gpu_bench: no CUDA device; nothing measured")
        return 0
    torch.manual_seed(0)
    int4, int8 = weights(4, 128), weights(8, 0)
    rows = []
    for m in (1, 2, 4, 8, 16, 256):
        dense = layer_ms_dense(m)
        w4, w8 = layer_ms_quant(m, int4), layer_ms_quant(m, int8)
        rows.append(
            {
                "batch": m,
                "bf16_ms": dense,
                "w4a16_ms": w4,
                "w8a16_ms": w8,
                "w4a16_speedup": dense / w4,
                "w8a16_speedup": dense / w8,
            }
        )
    prefill = 4096
    dense, fp8 = layer_ms_dense(prefill), layer_ms_fp8(prefill)
    rows.append({"batch": prefill, "bf16_ms": dense, "fp8_ms": fp8, "fp8_speedup": dense / fp8})
    decode = [r for r in rows if r["batch"] <= 16]
    verdict = {
        "w4a16_decode": min(r["w4a16_speedup"] for r in decode),
        "w4a16_b256": next(r["w4a16_speedup"] for r in rows if r["batch"] == 256),
        "fp8_prefill": rows[-1]["fp8_speedup"],
    }
    for r in rows:
        print("  ".join(f"{k}={v:.3f}" if isinstance(v, float) else f"{k}={v}" for k, v in r.items()))
    for name, value in verdict.items():
        status = "met" if value >= GOALS[name] else "NOT met"
        print(f"goal {name}: {value:.2f}x (goal >= {GOALS[name]}x) {status}")
    result = {"gpu": torch.cuda.get_device_name(0), "rows": rows, "verdict": verdict, "goals": GOALS}
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
