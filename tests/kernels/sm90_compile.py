"""Compile every Triton kernel for sm_90 (H100/H200) without a GPU and report registers and spills.

The interpreter checks numerics but not code generation; this checks that each kernel, at the tile
configurations the wrappers launch, lowers to PTX and assembles with Triton's bundled ptxas.
Integer and pointer arguments carry the divisible-by-16 hint Triton gives them at launch when the
value is a multiple of 16 (all strides of real caches are). Must run WITHOUT TRITON_INTERPRET.

Usage: python tests/kernels/sm90_compile.py  -> prints one JSON object per kernel configuration.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
warnings.filterwarnings("ignore")

import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from prefixflow.kernels import (  # noqa: E402
    triton_activation,
    triton_attention,
    triton_norm,
    triton_quant_gemm,
    triton_rotary,
    triton_store_kv,
)

TARGET = GPUTarget("cuda", 90, 32)
_POINTER_DTYPES = {
    "part_out_ptr": "fp32",
    "part_lse_ptr": "fp32",
    "cache_ptr": "fp32",
    "block_tables_ptr": "i32",
    "query_start_loc_ptr": "i32",
    "seq_lens_ptr": "i32",
    "slot_ptr": "i64",
    "pos_ptr": "i64",
    "qw_ptr": "i32",
    "s_ptr": "fp16",
    "z_ptr": "fp16",
    "m_ptr": "fp16",
    "g_ptr": "i32",
    "part_ptr": "fp32",
}
_NOT_ALIGNED = {"stride_bt", "num_reqs", "M"}  # block-table width, request count, rows: any value


def ptxas_path() -> str | None:
    base = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
    for name in ("ptxas-blackwell", "ptxas"):  # the newer one accepts Triton's PTX version
        if (base / name).exists():
            return str(base / name)
    return None


def compile_kernel(fn, consts: dict, dtype: str, num_warps: int, num_stages: int = 2) -> dict:
    """Build the launch signature from the kernel's own parameter list, compile, run ptxas -v."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in consts:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = "*" + _POINTER_DTYPES.get(name, dtype)
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif name in ("scale_log2", "eps"):
            signature[name] = "fp32"
        else:
            signature[name] = "i32"
            if name not in _NOT_ALIGNED:
                attrs[(i,)] = [["tt.divisibility", 16]]
    src = ASTSource(fn=fn, signature=signature, constexprs=consts, attrs=attrs)
    kernel = triton.compile(src, target=TARGET, options={"num_warps": num_warps, "num_stages": num_stages})
    result = {"shared": kernel.metadata.shared, "registers": None, "spill_bytes": None}
    ptxas = ptxas_path()
    if ptxas:
        with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
            f.write(kernel.asm["ptx"])
        proc = subprocess.run(
            [ptxas, "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull], capture_output=True, text=True
        )
        os.unlink(f.name)
        for line in proc.stderr.splitlines():
            if "Used" in line and "registers" in line:
                result["registers"] = int(line.split("Used")[1].split("registers")[0])
            if "spill stores" in line:
                result["spill_bytes"] = int(line.split("bytes spill stores")[0].split(",")[-1])
    return result


def attention_configs():
    """(name, fn, consts, warps) for the launches paged_attention makes at real shapes."""
    for q_heads, kv_heads, head_dim in [(32, 8, 128), (32, 8, 64), (32, 32, 128), (64, 8, 128), (8, 1, 256)]:
        group = q_heads // kv_heads
        group_p = triton.next_power_of_2(group)
        block_n = triton_attention._block_n(head_dim, interpreted=False)
        for decode_only in (True, False):
            block_q, warps = triton_attention.varlen_tile(decode_only, head_dim, group_p, interpreted=False)
            consts = dict(
                GROUP=group,
                GROUP_P=group_p,
                BLOCK_Q=block_q,
                BLOCK_N=block_n,
                HEAD_DIM=head_dim,
                BLOCK_SIZE=16,
                DOT_PREC=None,
                UPCAST=False,
                UNMASKED_BULK=not decode_only,
            )
            kind = "decode" if decode_only else "prefill"
            yield (
                f"varlen {kind} Hq{q_heads}/Hkv{kv_heads} D{head_dim}",
                triton_attention._varlen_kernel,
                consts,
                warps,
            )
        consts = dict(
            NUM_Q_HEADS=q_heads,
            NUM_SPLITS=8,
            GROUP=group,
            BLOCK_M=max(16, group_p),
            BLOCK_N=block_n,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=16,
            DOT_PREC=None,
            UPCAST=False,
        )
        yield (
            f"split decode Hq{q_heads}/Hkv{kv_heads} D{head_dim}",
            triton_attention._split_decode_kernel,
            consts,
            4,
        )
    yield (
        "merge splits D128",
        triton_attention._merge_splits_kernel,
        dict(NUM_Q_HEADS=32, NUM_SPLITS=8, SPLITS_P=8, HEAD_DIM=128),
        2,
    )


def pointwise_configs():
    yield (
        "store_kv Hkv8 D128",
        triton_store_kv._store_kv_kernel,
        dict(NUM_HEADS=8, HEAD_DIM=128, HEADS_P=8, DIM_P=128, BLOCK_SIZE=16),
        4,
    )
    for residual in (False, True):
        yield (
            f"rms_norm 4096 residual={residual}",
            triton_norm._rms_norm_kernel,
            dict(HIDDEN=4096, BLOCK=4096, HAS_RESIDUAL=residual),
            8,
        )
    yield (
        "rotary Hq32 Hkv8 D128",
        triton_rotary._rotary_kernel,
        dict(NUM_Q_HEADS=32, NUM_KV_HEADS=8, QH_P=32, KH_P=8, HALF=64),
        4,
    )
    yield "silu_and_mul 14336", triton_activation._silu_and_mul_kernel, dict(INTER=14336, BLOCK=1024), 4


def quant_configs():
    """The W4A16/W8A16 GEMM launches of triton_quant_gemm.quant_linear (compiled, not interpreted)."""
    for bits in (4, 8):
        for has_g, has_z, has_m in ((False, True, False), (True, True, False), (False, False, True)):
            consts = dict(
                BITS=bits,
                GROUP=128 if not has_m else 32,
                DEFAULT_ZERO=1 << (bits - 1),
                HAS_Z=has_z,
                HAS_M=has_m,
                HAS_G=has_g,
                BLOCK_K=32 if has_m else 64,
                UPCAST=False,
            )
            tag = f"w{bits} g_idx={has_g} zeros={has_z} mins={has_m}"
            yield (
                f"quant tiled {tag}",
                triton_quant_gemm._tiled_kernel,
                dict(consts, BLOCK_M=64, BLOCK_N=128),
                8,
            )
            yield (
                f"quant split-K {tag}",
                triton_quant_gemm._split_k_kernel,
                dict(consts, BLOCK_M=16, BLOCK_N=64),
                4,
            )


def main() -> int:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        print("unset TRITON_INTERPRET: interpreted kernels cannot be compiled", file=sys.stderr)
        return 2
    failed = 0
    for name, fn, consts, warps in [*attention_configs(), *pointwise_configs(), *quant_configs()]:
        row = {"kernel": name, "num_warps": warps}
        try:
            row |= compile_kernel(fn, consts, "bf16", warps)
        except Exception as exc:  # report every failure, not just the first
            row["error"] = f"{type(exc).__name__}: {str(exc)[:500]}"
            failed += 1
        print(json.dumps(row), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
