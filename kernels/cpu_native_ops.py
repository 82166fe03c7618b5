"""Norm, rotary and SiLU-and-mul on bf16 or float32 CPU rows, and the paged KV store, one native call
each (kernels/native/elementwise.c).

Why: at a small batch these ops are dispatch, not arithmetic. ``cpu_ops`` spends 5 to 20 torch calls
per op (casts, the op, products, a cast back), a few microseconds each, 30 layers a step, on one
thread however many the step has (benchmarks/RESULTS.md issue 24, "Twelfth round" to "Fourteenth
round"). The KV store is the same story: ``reference.store_kv`` is eight torch calls a layer (a mask,
three masked selections, two scatters). Each function here takes the native kernel where the call
fits it (CPU, bf16 or float32, rows of 16-element multiples, unit stride along a row; the store: any
dtype the caches share) and hands every other call to ``cpu_ops`` (the store to ``reference``), whose
contract it keeps. Float32 rows are the default of a CPU without native bf16 (AVX2): there the native
calls made batch 1 1.07x and batch 16 1.03x faster end to end, batch 64 level (RESULTS.md issue 24,
"Sixteenth round").

Rows are computed independently (the batch-invariant mode's requirement). Rotary gives the reference's
bits; the norm and SiLU can differ from ``reference.py`` by one bf16 rounding step, or a few float32 ulps
(a sum of squares and an ``exp`` in another order), tested against it within that.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from prefixflow.kernels import cpu_ops, native_build, reference

USE_NATIVE = True  # False: every call on ``cpu_ops`` (benchmarks/cpu_path.py's ``pf-torch-elementwise``)


@functools.cache
def _built() -> ctypes.CDLL | None:
    """The library with its signatures declared, once (native_build caches the build and the load)."""
    lib = native_build.load("elementwise")
    if lib is not None:
        p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
        lib.pf_rms_norm.argtypes = [p, i64, p, i64, p, p, p, i64, i32, f32, i32]
        lib.pf_rotary.argtypes = [p, i64, i32, p, i64, i32, i32, p, p, i64, p, p, i64, i32]
        lib.pf_silu_and_mul.argtypes = [p, i64, i32, p, i64, i32]
        lib.pf_store_kv.argtypes = [p, i64, p, i64, p, p, i64, p, i64, i64]
        for fn in (lib.pf_rms_norm, lib.pf_rotary, lib.pf_silu_and_mul, lib.pf_store_kv):
            fn.restype = ctypes.c_int
    return lib


def _library() -> ctypes.CDLL | None:
    return _built() if USE_NATIVE else None


def available() -> bool:
    """Whether the native library is built and loaded (else every call takes ``cpu_ops``)."""
    return _library() is not None


ROW_DTYPES = (torch.bfloat16, torch.float32)


def _rows_fit(x: torch.Tensor, width: int) -> bool:
    """A CPU bf16 or float32 matrix whose rows are contiguous and ``width`` a multiple of 16."""
    return (
        x.device.type == "cpu"
        and x.dtype in ROW_DTYPES
        and x.dim() == 2
        and x.stride(-1) == 1
        and width % 16 == 0
        and x.shape[0] > 0
    )


def _check(code: int, op: str) -> None:
    if code:
        raise RuntimeError(f"native {op} failed with code {code}")


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``cpu_ops.rms_norm``: with a residual, the sum (rounded to bf16) is normalised and returned."""
    lib = _library()
    hidden = x.shape[-1]
    if (
        lib is None
        or not _rows_fit(x, hidden)
        or weight.dtype != x.dtype
        or not weight.is_contiguous()
        or (
            residual is not None
            and (not _rows_fit(residual, hidden) or residual.shape != x.shape or residual.dtype != x.dtype)
        )
    ):
        return cpu_ops.rms_norm(x, weight, eps, residual)
    rows = x.shape[0]
    out = torch.empty(rows, hidden, dtype=x.dtype)
    new_residual = None if residual is None else torch.empty(rows, hidden, dtype=x.dtype)
    code = lib.pf_rms_norm(
        x.data_ptr(),
        x.stride(0),
        None if residual is None else residual.data_ptr(),
        0 if residual is None else residual.stride(0),
        weight.data_ptr(),
        out.data_ptr(),
        None if new_residual is None else new_residual.data_ptr(),
        rows,
        hidden,
        eps,
        x.dtype == torch.float32,
    )
    _check(code, "rms_norm")
    return out if new_residual is None else (out, new_residual)


def _heads_fit(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """A CPU [rows, heads, head_dim] tensor of ``dtype`` whose heads lie contiguous within a row (its
    rows may lie apart: q, k and v are views of the fused qkv output)."""
    return (
        x.device.type == "cpu"
        and x.dtype == dtype
        and x.dim() == 3
        and x.stride(2) == 1
        and x.stride(1) == x.shape[2]
        and x.shape[0] > 0
    )


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cpu_ops.rotary``: neox-style rotary embedding of q [T, Hq, D] and k [T, Hkv, D]."""
    lib = _library()
    head_dim = q.shape[-1]
    if (
        lib is None
        or q.dtype not in ROW_DTYPES
        or not (_heads_fit(q, q.dtype) and _heads_fit(k, q.dtype))
        or k.shape[0] != q.shape[0]
        or k.shape[2] != head_dim
        or (head_dim // 2) % 16
        or cos_sin_cache.dtype != torch.float32
        or not cos_sin_cache.is_contiguous()
        or cos_sin_cache.shape[-1] != head_dim
        or positions.device.type != "cpu"
        or positions.shape != (q.shape[0],)
    ):
        return cpu_ops.rotary(q, k, positions, cos_sin_cache)
    rows = q.shape[0]
    where = positions.to(torch.int64).contiguous()  # no copy when it is already so
    q_out = torch.empty(q.shape, dtype=q.dtype)
    k_out = torch.empty(k.shape, dtype=k.dtype)
    code = lib.pf_rotary(
        q.data_ptr(),
        q.stride(0),
        q.shape[1],
        k.data_ptr(),
        k.stride(0),
        k.shape[1],
        head_dim,
        where.data_ptr(),
        cos_sin_cache.data_ptr(),
        cos_sin_cache.shape[0],
        q_out.data_ptr(),
        k_out.data_ptr(),
        rows,
        q.dtype == torch.float32,
    )
    if code == -2:
        raise IndexError(
            f"a rotary position lies outside the cos/sin cache of {cos_sin_cache.shape[0]} positions"
        )
    _check(code, "rotary")
    return q_out, k_out


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``cpu_ops.silu_and_mul``: silu(x[:, :I]) * x[:, I:], float32 inside."""
    lib = _library()
    half = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1]) if x.dim() != 2 else x
    if lib is None or x.shape[-1] % 2 or not _rows_fit(rows, half):
        return cpu_ops.silu_and_mul(x)
    out = torch.empty(rows.shape[0], half, dtype=x.dtype)
    _check(
        lib.pf_silu_and_mul(
            rows.data_ptr(), rows.stride(0), half, out.data_ptr(), rows.shape[0], x.dtype == torch.float32
        ),
        "silu_and_mul",
    )
    return out.view(*x.shape[:-1], half)


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """``reference.store_kv``: token t's K/V into slot ``slot_mapping[t]`` (negative: not stored), one
    byte copy per token where key, value and both caches share a dtype; else the reference."""
    lib = _library()
    if (
        lib is None
        or k_cache.shape != v_cache.shape
        or v_cache.dtype != k_cache.dtype
        or not (k_cache.is_contiguous() and v_cache.is_contiguous())
        or k_cache.device.type != "cpu"
        or not (_heads_fit(key, k_cache.dtype) and _heads_fit(value, k_cache.dtype))
        or not key.shape[1:] == value.shape[1:] == k_cache.shape[2:]
        or value.shape[0] != key.shape[0]
        or slot_mapping.dtype != torch.int64
        or slot_mapping.device.type != "cpu"
        or slot_mapping.shape != (key.shape[0],)
    ):
        reference.store_kv(key, value, k_cache, v_cache, slot_mapping)
        return
    num_slots = k_cache.shape[0] * k_cache.shape[1]
    item = key.element_size()
    code = lib.pf_store_kv(
        key.data_ptr(),
        key.stride(0) * item,
        value.data_ptr(),
        value.stride(0) * item,
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        num_slots,
        slot_mapping.contiguous().data_ptr(),
        key.shape[0],
        key.shape[1] * key.shape[2] * item,
    )
    if code == -2:
        raise IndexError(f"a KV slot lies outside the cache of {num_slots} slots")
    _check(code, "store_kv")
