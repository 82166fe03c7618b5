"""The native row attention kernel (kernels/native/paged_attention.c): a past revision's against this tree's.

Why: a decode step reads every request's K and V from DRAM (30 layers of them do not fit any cache), so
the kernel is timed over ``--layers`` distinct caches per step, as the engine calls it, not over one
cache that stays in L2. Both builds use the engine's flags (kernels/native_build.py,
``PREFIXFLOW_NATIVE_MARCH``). Per case (requests, query rows per request, context tokens, dtype): ms
per step of process CPU time, the two builds interleaved A B A B over the same random paged caches
(SmolLM2-135M's heads: 9 query, 3 KV, head dim 64, blocks of 16, blocks shuffled across the cache),
min and median of ``--rounds``; the outputs of the two builds are compared too.

    python -m benchmarks.row_attention_ab --base HEAD --threads 1 \
        --json benchmarks/results/row_attention_ab.json
"""

from __future__ import annotations

import argparse
import ctypes
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks.common import environment, print_table, write_json
from prefixflow.kernels import native_build

CASES = [(64, 1, 192), (64, 1, 1024), (16, 1, 160), (8, 5, 200), (16, 128, 128)]
HQ, HKV, D, BS = 9, 3, 64, 16
DTYPES = {"float32": (torch.float32, 0), "bfloat16": (torch.bfloat16, 1)}


def build(source: str, where: Path, name: str) -> Any:
    path = where / f"{name}.c"
    path.write_text(source)
    lib_path = where / f"{name}.so"
    compiler = native_build._compiler()
    if compiler is None:
        raise SystemExit("no C compiler found (set CC, or install cc, gcc or clang)")
    subprocess.run([compiler, *native_build.flags(), str(path), "-o", str(lib_path)], check=True)
    fn = ctypes.CDLL(str(lib_path)).pf_paged_attention
    p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
    fn.argtypes = [p, p, i32, i64, i32, p, p, i32, i64, i32, i32, i32, p, i64, p, p, i32, f32, i32]
    fn.restype = ctypes.c_int
    return fn


def make_step(
    requests: int, rows: int, ctx: int, dtype: torch.dtype, layers: int, seed: int
) -> dict[str, Any]:
    """Random queries and ``layers`` caches with every request's blocks scattered over the cache."""
    gen = torch.Generator().manual_seed(seed)
    per_req = (ctx + BS - 1) // BS
    num_blocks = requests * per_req
    order = torch.randperm(num_blocks, generator=gen).to(torch.int32)
    tables = order.view(requests, per_req).contiguous()
    caches = [
        (
            torch.randn(num_blocks, BS, HKV, D, generator=gen).to(dtype),
            torch.randn(num_blocks, BS, HKV, D, generator=gen).to(dtype),
        )
        for _ in range(layers)
    ]
    q = torch.randn(requests * rows, HQ, D, generator=gen).to(dtype)
    starts = torch.arange(0, requests * rows + 1, rows, dtype=torch.int32)
    lens = torch.full((requests,), ctx, dtype=torch.int32)
    return {"q": q, "caches": caches, "tables": tables, "starts": starts, "lens": lens, "blocks": num_blocks}


def run_step(fn: Any, step: dict[str, Any], code: int, threads: int) -> tuple[float, torch.Tensor]:
    q, tables, starts, lens = step["q"], step["tables"], step["starts"], step["lens"]
    out = torch.empty_like(q)
    c = time.process_time()
    for k, v in step["caches"]:
        status = fn(
            q.data_ptr(), out.data_ptr(), code, q.shape[0], HQ, k.data_ptr(), v.data_ptr(), code,
            step["blocks"], BS, HKV, D, tables.data_ptr(), tables.shape[1], starts.data_ptr(),
            lens.data_ptr(), lens.shape[0], D**-0.5, threads,
        )  # fmt: skip
        if status:
            raise RuntimeError(f"kernel returned {status}")
    return (time.process_time() - c) * 1e3, out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", default="HEAD", help="the revision whose kernel is the A side")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--layers", type=int, default=30)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--cases", default=None, help="requests:rows:ctx,... (default: CASES)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    cases = [tuple(int(x) for x in c.split(":")) for c in args.cases.split(",")] if args.cases else CASES
    src = native_build.SOURCE_DIR / "paged_attention.c"
    rel = src.relative_to(src.parents[2]).as_posix()
    base_src = subprocess.run(
        ["git", "show", f"{args.base}:{rel}"], cwd=src.parents[2], capture_output=True, text=True, check=True
    ).stdout
    rows_out = []
    with tempfile.TemporaryDirectory() as tmp:
        base = build(base_src, Path(tmp), "base")
        here = build(src.read_text(), Path(tmp), "here")
        for dname in args.dtypes.split(","):
            dtype, code = DTYPES[dname]
            for requests, rows, ctx in cases:
                step = make_step(requests, rows, ctx, dtype, args.layers, seed=requests * 1000 + ctx)
                times: dict[str, list[float]] = {"base": [], "here": []}
                outs = {}
                for _ in range(args.rounds):
                    for side, fn in (("base", base), ("here", here)):
                        ms, outs[side] = run_step(fn, step, code, args.threads)
                        times[side].append(ms)
                same = bool(torch.equal(outs["base"], outs["here"]))
                rows_out.append(
                    {
                        "dtype": dname,
                        "requests": requests,
                        "rows": rows,
                        "ctx": ctx,
                        "base_ms_min": round(min(times["base"]), 2),
                        "base_ms_med": round(statistics.median(times["base"]), 2),
                        "here_ms_min": round(min(times["here"]), 2),
                        "here_ms_med": round(statistics.median(times["here"]), 2),
                        "speedup_med": round(
                            statistics.median(times["base"]) / statistics.median(times["here"]), 3
                        ),
                        "same_bits": same,
                    }
                )
                print(rows_out[-1], flush=True)
    print_table(rows_out, list(rows_out[0]))
    result = {"environment": environment(), "args": vars(args), "rows": rows_out}
    if args.json:
        write_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
