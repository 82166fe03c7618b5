"""The native GGUF matvec of a past revision against the working tree's, per decode step of SmolLM2's shapes.

One step is the 30 layers' Q4_1 products (qkv 960x576, o 576x576, gate|up 3072x576, down 576x1536) and,
apart, the tied Q8_0 LM head (49152x576), at each row count. Blocks are random (the time does not
depend on the values), 30 layers of them so that a step streams its weights from DRAM as the engine's
does. Both builds use the flags the engine uses (kernels/native_build.py, ``PREFIXFLOW_NATIVE_MARCH``
included); the revisions alternate within each repeat, and the best of ``--repeats`` is reported. With
``--dense`` the float32 ``F.linear`` of the same shapes is timed too (run it under the ISA limits of
the host being emulated: ``MKL_ENABLE_INSTRUCTIONS=AVX2 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2``).

    PREFIXFLOW_NATIVE_MARCH=haswell python -m benchmarks.gguf_matvec_ab --base a55c65c --threads 1,2 \\
        --json benchmarks/results/gguf_matvec_ab.json
"""

from __future__ import annotations

import argparse
import ctypes
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from benchmarks.common import environment, write_json
from prefixflow.kernels import native_build

LAYER_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))
HEAD = (49152, 576)
Q4_1, Q8_0 = 2, 0


Matvec = Callable[[int, torch.Tensor, int, int, torch.Tensor, int, torch.Tensor, int], None]


def _build(source: str, where: Path, name: str) -> Matvec:
    """The revision's ``pf_gguf_matvec`` as ``(kind, blocks, n, k, x, rows, out, threads)``. Before the
    sixteenth round the C function took a scratch buffer for the block sums (``float *sums``); this
    passes one to a revision that asks for it."""
    path = where / f"{name}.c"
    path.write_text(source)
    lib_path = where / f"{name}.so"
    subprocess.run(["cc", *native_build.flags(), str(path), "-o", str(lib_path)], check=True)
    fn = ctypes.CDLL(str(lib_path)).pf_gguf_matvec
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    takes_sums = "float *sums" in source
    fn.argtypes = [i32, p, i64, i64, p, i64, i64, p, i64, *([p] if takes_sums else []), i32]

    def matvec(
        kind: int,
        blocks: torch.Tensor,
        n: int,
        k: int,
        x: torch.Tensor,
        rows: int,
        out: torch.Tensor,
        threads: int,
    ) -> None:
        if takes_sums:  # allocated per call, as the engine's wrapper did then
            sums = torch.empty(rows * (k // 32))
            fn(
                kind,
                blocks.data_ptr(),
                n,
                k,
                x.data_ptr(),
                k,
                rows,
                out.data_ptr(),
                n,
                sums.data_ptr(),
                threads,
            )
        else:
            fn(kind, blocks.data_ptr(), n, k, x.data_ptr(), k, rows, out.data_ptr(), n, threads)

    return matvec


def _blocks(n: int, k: int, block_bytes: int) -> torch.Tensor:
    raw = torch.randint(0, 256, (n, k // 32, block_bytes), dtype=torch.uint8)
    raw[..., 0:2] = torch.tensor([0x00, 0x20], dtype=torch.uint8)  # d: a small float16
    if block_bytes == 20:
        raw[..., 2:4] = torch.tensor([0x00, 0xA0], dtype=torch.uint8)  # m
    return raw


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--base", required=True, help="the git revision whose kernel is the A side")
    ap.add_argument("--rows", default="1,2,3,4,8,16,32,64")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--dense", action="store_true", help="time the dense float32 F.linear too")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    base_source = subprocess.run(
        ["git", "show", f"{args.base}:kernels/native/gguf_matvec.c"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    here = (native_build.SOURCE_DIR / "gguf_matvec.c").read_text()
    torch.manual_seed(0)
    layers = [(n, k, _blocks(n, k, 20)) for _ in range(30) for n, k in LAYER_SHAPES]
    head = _blocks(*HEAD, 34)
    dense = [torch.randn(n, k) * 0.01 for n, k, _ in layers] if args.dense else []
    row_counts = [int(r) for r in args.rows.split(",")]
    xs = {k: torch.randn(max(row_counts), k) for k in (576, 1536)}
    out = torch.empty(max(row_counts) * HEAD[0])
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        libs = {"base": _build(base_source, Path(tmp), "base"), "here": _build(here, Path(tmp), "here")}
        for threads in (int(t) for t in args.threads.split(",")):
            torch.set_num_threads(threads)
            for rows in row_counts:
                best: dict[str, float] = {}
                for _ in range(args.repeats):
                    for side, lib in libs.items():
                        start = time.perf_counter()
                        for n, k, blocks in layers:
                            lib(Q4_1, blocks, n, k, xs[k], rows, out, threads)
                        best[f"{side}_layers_ms"] = min(
                            best.get(f"{side}_layers_ms", 1e9), time.perf_counter() - start
                        )
                        start = time.perf_counter()
                        lib(Q8_0, head, *HEAD, xs[HEAD[1]], rows, out, threads)
                        best[f"{side}_head_ms"] = min(
                            best.get(f"{side}_head_ms", 1e9), time.perf_counter() - start
                        )
                    if dense:
                        start = time.perf_counter()
                        for weight in dense:
                            F.linear(xs[weight.shape[1]][:rows], weight)
                        best["dense_layers_ms"] = min(
                            best.get("dense_layers_ms", 1e9), time.perf_counter() - start
                        )
                row = {"threads": threads, "rows": rows, **{key: value * 1e3 for key, value in best.items()}}
                row["layers_base_over_here"] = row["base_layers_ms"] / row["here_layers_ms"]
                row["head_base_over_here"] = row["base_head_ms"] / row["here_head_ms"]
                if dense:
                    row["layers_dense_over_here"] = row["dense_layers_ms"] / row["here_layers_ms"]
                results.append(row)
                extra = f"  dense {row['dense_layers_ms']:6.1f} ms" if dense else ""
                print(
                    f"t{threads} rows {rows:3d}  layers {row['base_layers_ms']:6.1f} -> {row['here_layers_ms']:6.1f} ms"
                    f" ({row['layers_base_over_here']:.2f}x)  head {row['base_head_ms']:6.2f} -> "
                    f"{row['here_head_ms']:6.2f} ms ({row['head_base_over_here']:.2f}x){extra}"
                )
    report = {
        "benchmark": "gguf_matvec_ab",
        "base": args.base,
        "environment": environment(),
        "results": results,
    }
    if args.json:
        write_json(args.json, report)
    return report


if __name__ == "__main__":
    main()
