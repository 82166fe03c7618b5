"""Float32 CPU matmul at the few-row shapes of speculative verification and a job's tail (issue 27, 24).

Why: verifying k=4 drafts at batch 1 multiplies 5 rows through every layer and the 49,152-wide LM head;
``F.linear(x, W)`` (``x @ W^T``) at 2-7 rows takes MKL's GEMM with a tiny M, which on a 2-core Zen 3
cost about 3x the 1-row GEMV for the LM head. The candidate ``(W @ x^T)^T`` gives MKL the large
dimension as M. Per (layer, rows): process CPU microseconds per call, best of ``--repeats`` timed
blocks, interleaved A B A B, and the largest absolute difference between the two results. With
``--dtype bfloat16`` on a CPU whose oneDNN prepacks bf16, kernels/cpu_linear.py's prepacked path too.

    python -m benchmarks.cpu_linear_rows --threads 1 --json benchmarks/results/cpu_linear_rows.json
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from benchmarks.common import environment, print_table, write_json
from prefixflow.kernels import cpu_linear

# SmolLM2-135M-Instruct: (name, out_features, in_features)
LAYERS = (
    ("q|k|v 960x576", 960, 576),
    ("o 576x576", 576, 576),
    ("gate|up 3072x576", 3072, 576),
    ("down 576x1536", 576, 1536),
    ("LM head 49152x576", 49152, 576),
)


def linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.linear(x, w)


def transposed(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.mm(w, x.t()).t().contiguous()


def prepacked(x: torch.Tensor, w: cpu_linear.PrepackedWeight) -> torch.Tensor:
    return cpu_linear.prepacked_linear(x, w, None)


def cpu_us(fn: Callable[..., torch.Tensor], x: torch.Tensor, w: object, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        fn(x, w)
    return (time.process_time() - start) / calls * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rows", default="1,2,3,4,5,6,8")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    dtype = getattr(torch, args.dtype)
    packable = cpu_linear.prepack_unsupported(dtype) is None  # bf16 on a CPU whose oneDNN reorders it
    records = []
    for name, out_f, in_f in LAYERS:
        w = (torch.randn(out_f, in_f) / in_f**0.5).to(dtype)
        packed = cpu_linear.prepack(w) if packable else None
        calls = max(3, int(2e8 / (out_f * in_f)))
        for rows in (int(r) for r in args.rows.split(",")):
            x = torch.randn(rows, in_f).to(dtype)
            diff = float((linear(x, w) - transposed(x, w)).float().abs().max())
            best = {"linear": float("inf"), "transposed": float("inf")}
            if packed is not None:
                best["prepacked"] = float("inf")
            for _ in range(args.repeats):
                best["linear"] = min(best["linear"], cpu_us(linear, x, w, calls))
                best["transposed"] = min(best["transposed"], cpu_us(transposed, x, w, calls))
                if packed is not None:
                    best["prepacked"] = min(best["prepacked"], cpu_us(prepacked, x, packed, calls))
            ratio = best["linear"] / best["transposed"]
            records.append({"layer": name, "rows": rows, **best, "speedup": ratio, "max_abs_diff": diff})
    columns = ["layer", "rows", "linear", "transposed", *(["prepacked"] if packable else []), "speedup"]
    print_table(
        records, [*columns, "max_abs_diff"], title=f"{args.dtype}, {args.threads} thread(s), CPU us per call"
    )
    if args.json:
        write_json(
            args.json,
            {"env": environment(), "threads": args.threads, "dtype": args.dtype, "results": records},
        )


if __name__ == "__main__":
    main()
