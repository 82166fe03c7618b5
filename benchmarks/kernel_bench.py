"""Time each Triton kernel against its torch reference at real (Llama-3.1-8B layer) shapes on CUDA,
as a fraction of the ceilings measured in the same run (copy bandwidth, bf16 matmul rate).

Goals (issue 5): decode attention at batch 256 x context 1024 >= 70 % of copy bandwidth; prefill
attention over 4k tokens >= 50 % of the bf16 matmul rate.

Run: PYTHONPATH=. python benchmarks/kernel_bench.py [--json results.json]
On a machine without CUDA it says so and exits 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

HQ, HKV, D, HIDDEN, INTER, BLOCK = 32, 8, 128, 4096, 14336, 16
BF16 = torch.bfloat16


@dataclass
class Row:
    kernel: str
    shape: str
    triton_ms: float
    torch_ms: float
    work: float  # bytes or FLOPs moved/done by one call
    unit: str  # "B" (judged against copy bandwidth) or "FLOP" (against matmul rate)
    fraction: float = 0.0  # of the matching ceiling
    goal: float | None = None

    @property
    def speedup(self) -> float:
        return self.torch_ms / self.triton_ms


def bench_ms(fn: Callable[[], object], rep_ms: int = 200) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=25, rep=rep_ms, return_mode="median"))


def paged_inputs(shapes: list[tuple[int, int]], seed: int = 0) -> tuple[torch.Tensor, ...]:
    """q, caches, tables, query_start_loc, seq_lens for (query_len, seq_len) requests; shuffled blocks."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    per_req = [-(-s // BLOCK) for _, s in shapes]
    num_blocks = sum(per_req)
    k_cache = torch.randn(num_blocks, BLOCK, HKV, D, device="cuda", dtype=BF16, generator=gen)
    v_cache = torch.randn_like(k_cache)
    perm = torch.randperm(num_blocks, device="cuda", generator=gen).to(torch.int32)
    tables = torch.zeros(len(shapes), max(per_req), dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(per_req):
        tables[b, :n] = perm[used : used + n]
        used += n
    starts = torch.tensor([0] + [q for q, _ in shapes], device="cuda").cumsum(0).to(torch.int32)
    q = torch.randn(int(starts[-1]), HQ, D, device="cuda", dtype=BF16, generator=gen)
    seq_lens = torch.tensor([s for _, s in shapes], dtype=torch.int32, device="cuda")
    return q, k_cache, v_cache, tables, starts, seq_lens


def attention_rows() -> list[Row]:
    from prefixflow.kernels import reference, triton_attention

    scale = D**-0.5
    rows = []
    cases = [
        ("decode attention", "256 x ctx 1024", [(1, 1024)] * 256, "B", 0.70),
        ("decode attention (split-KV)", "8 x ctx 8192", [(1, 8192)] * 8, "B", None),
        ("prefill attention", "1 x 4096 causal", [(4096, 4096)], "FLOP", 0.50),
        ("mixed step", "192 dec x 1024 + 2 x 512/1536", [(1, 1024)] * 192 + [(512, 1536)] * 2, "B", None),
    ]
    for name, shape, reqs, unit, goal in cases:
        args = paged_inputs(reqs)
        q = args[0]
        out = torch.empty_like(q)
        t_ms = bench_ms(lambda a=args, o=out: triton_attention.paged_attention(*a, scale, out=o))
        r_ms = bench_ms(lambda a=args: reference.paged_attention(*a, scale), rep_ms=100)
        kv_bytes = 2 * sum(s for _, s in reqs) * HKV * D * 2
        keys = sum(sum(range(s - ql + 1, s + 1)) for ql, s in reqs)  # causal key count over all queries
        work = kv_bytes + 2 * q.numel() * 2 if unit == "B" else 4 * HQ * D * keys
        rows.append(Row(name, shape, t_ms, r_ms, work, unit, goal=goal))
    return rows


def pointwise_rows(tokens: int = 8192) -> list[Row]:
    from prefixflow.kernels import (
        build_rope_cache,
        reference,
        triton_activation,
        triton_norm,
        triton_rotary,
        triton_store_kv,
    )

    dev = "cuda"
    key = torch.randn(tokens, HKV, D, device=dev, dtype=BF16)
    k_cache = torch.empty(tokens // BLOCK + 1, BLOCK, HKV, D, device=dev, dtype=BF16)
    v_cache = torch.empty_like(k_cache)
    slots = torch.randperm(k_cache.shape[0] * BLOCK, device=dev)[:tokens]
    x = torch.randn(tokens, HIDDEN, device=dev, dtype=BF16)
    res = torch.randn_like(x)
    w = torch.randn(HIDDEN, device=dev, dtype=BF16)
    q = torch.randn(tokens, HQ, D, device=dev, dtype=BF16)
    pos = torch.randint(0, 8192, (tokens,), device=dev)
    cache = build_rope_cache(D, 8192, 500000.0).to(dev)
    gate_up = torch.randn(tokens, 2 * INTER, device=dev, dtype=BF16)
    cases = [
        (
            "store_kv",
            f"{tokens} tok",
            lambda m: m.store_kv(key, key, k_cache, v_cache, slots),
            2 * 2 * key.numel() * 2,
        ),
        ("add + rms_norm", f"{tokens} x {HIDDEN}", lambda m: m.rms_norm(x, w, 1e-5, res), 4 * x.numel() * 2),
        (
            "rotary",
            f"{tokens} tok q+k",
            lambda m: m.rotary(q, key, pos, cache),
            2 * (q.numel() + key.numel()) * 2,
        ),
        ("silu_and_mul", f"{tokens} x {INTER}", lambda m: m.silu_and_mul(gate_up), 3 * tokens * INTER * 2),
    ]
    mods = {"store_kv": triton_store_kv, "add + rms_norm": triton_norm, "rotary": triton_rotary}
    rows = []
    for name, shape, call, nbytes in cases:
        mod = mods.get(name, triton_activation)
        rows.append(
            Row(
                name,
                shape,
                bench_ms(lambda c=call, m=mod: c(m)),
                bench_ms(lambda c=call: c(reference)),
                nbytes,
                "B",
            )
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Triton kernels vs torch reference at real shapes (CUDA)")
    ap.add_argument("--json", default=None, help="write the rows and ceilings here")
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_bench: needs a CUDA GPU; nothing to measure on this machine (skipped).")
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.roofline import measure_ceilings

    ceilings = measure_ceilings("cuda", BF16)
    rows = attention_rows() + pointwise_rows()
    for row in rows:
        per_s = row.work / (row.triton_ms / 1e3)
        row.fraction = per_s / (ceilings.bytes_per_s if row.unit == "B" else ceilings.flops_per_s)

    print(
        f"ceilings on {ceilings.device}: copy {ceilings.bytes_per_s / 1e12:.2f} TB/s, "
        f"bf16 matmul {ceilings.flops_per_s / 1e12:.0f} TFLOP/s"
    )
    print(
        f"{'kernel':30} {'shape':30} {'triton ms':>10} {'torch ms':>10} {'speedup':>8} {'of ceiling':>11} {'goal':>6}"
    )
    for r in rows:
        goal = f"{r.goal:.0%}" if r.goal is not None else ""
        print(
            f"{r.kernel:30} {r.shape:30} {r.triton_ms:10.3f} {r.torch_ms:10.3f} {r.speedup:7.1f}x "
            f"{r.fraction:10.1%} {r.unit:>4} {goal:>6}"
        )
    result = {"ceilings": asdict(ceilings), "rows": [asdict(r) | {"speedup": r.speedup} for r in rows]}
    text = json.dumps(result, indent=2)
    if args.json:
        Path(args.json).write_text(text)
    else:
        print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
