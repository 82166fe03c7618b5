"""Paged attention for the CPU, one query row at a time, K and V read in place (kernels/native/paged_attention.c).

Why: decode steps gathered every request's K/V blocks into a copy per layer, converted K to float32
and ran per-head matmuls; at batch 64 attention took a third of a step and scaled worst with a second
thread (benchmarks/RESULTS.md issue 24, "Eleventh round"). The C kernel walks each row's block table,
shares every K/V row among the query heads of its group, and spreads rows over torch's OpenMP threads.

A row's result depends only on the row (its query, its context length, the K/V it reads), never on the
other rows of the step, on how its prompt was chunked or on the thread count: the same bits as a
one-row call. So it is also the batch-invariant kernel (``backend.batch_invariant``), and a
speculative verification row attends exactly as the decode it replaces. Same contract as
``reference.paged_attention``; float32 inside, one rounding into the query's dtype.

``available(q, k_cache)`` says whether a call can take it: CPU tensors in float32 or bf16 and the
library built (kernels/native_build.py); otherwise callers keep their torch path.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable

import torch

from prefixflow.kernels import cpu_attention, invariant_attention, native_build
from prefixflow.kernels.cpu_features import amx_tiles, avx2, avx512

_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
_ERRORS = {
    -1: "a block table names a block outside the KV cache",
    -2: "inconsistent query starts, context lengths or block table width",
    -3: "out of memory",
    -4: "head_dim must be a multiple of 16, at most 256",
}
_fn: Callable[..., int] | None = None
_fn_ready = False
_lock = threading.Lock()


def _function() -> Callable[..., int] | None:
    global _fn, _fn_ready
    if _fn_ready:
        return _fn
    with _lock:
        if not _fn_ready:
            lib = native_build.load("paged_attention")
            if lib is not None:
                fn = lib.pf_paged_attention
                p, i64, i32, f32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_float
                fn.argtypes = [
                    p,
                    p,
                    i32,
                    i64,
                    i32,
                    p,
                    p,
                    i32,
                    i64,
                    i32,
                    i32,
                    i32,
                    p,
                    i64,
                    p,
                    p,
                    i32,
                    f32,
                    i32,
                ]
                fn.restype = ctypes.c_int
                _fn = fn
            _fn_ready = True
    return _fn


def available(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether ``paged_attention_rows`` can run this call (else keep the torch path)."""
    return (
        q.device.type == "cpu"
        and k_cache.device.type == "cpu"
        and q.dtype in _DTYPES
        and k_cache.dtype in _DTYPES
        and q.shape[1] // k_cache.shape[2] <= 64
        and q.shape[-1] % 16 == 0
        and q.shape[-1] <= 256
        and _function() is not None
    )


def _int32(t: torch.Tensor) -> torch.Tensor:
    """The kernel's int32 contiguous metadata: the engine's own, as they are (its step metadata is built
    int32), a copy of anyone else's. Converted per call, never cached: a cache recognising the step's
    tensors by value cost three ``torch.equal`` a layer, and by version counter cannot work on
    inference tensors (RESULTS.md issue 24, "Fourteenth round")."""
    return t if t.dtype == torch.int32 and t.is_contiguous() else t.to(torch.int32).contiguous()


def paged_attention_rows(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The contract of ``reference.paged_attention`` on the native kernel (``available`` must hold)."""
    fn = _function()
    if fn is None:
        raise RuntimeError("the native paged-attention kernel is not built (kernels/native_build.py)")
    num_tokens, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, cache_dim = k_cache.shape
    if num_q_heads % num_kv_heads or cache_dim != head_dim or v_cache.shape != k_cache.shape:
        raise ValueError(
            f"q {tuple(q.shape)} does not fit caches {tuple(k_cache.shape)} / {tuple(v_cache.shape)}"
        )
    if v_cache.dtype != k_cache.dtype:
        raise ValueError(f"K cache {k_cache.dtype} and V cache {v_cache.dtype} differ")
    tables, starts, lens = _int32(block_tables), _int32(query_start_loc), _int32(seq_lens)
    if starts.shape[0] != lens.shape[0] + 1 or tables.shape[0] < lens.shape[0]:
        raise ValueError("query_start_loc needs one entry more than seq_lens, block_tables a row per request")
    q = q.contiguous()
    k_cache, v_cache = k_cache.contiguous(), v_cache.contiguous()
    out = torch.empty_like(q)
    status = fn(
        q.data_ptr(),
        out.data_ptr(),
        _DTYPES[q.dtype],
        num_tokens,
        num_q_heads,
        k_cache.data_ptr(),
        v_cache.data_ptr(),
        _DTYPES[k_cache.dtype],
        num_blocks,
        block_size,
        num_kv_heads,
        head_dim,
        tables.data_ptr(),
        tables.shape[1] if tables.dim() == 2 else 0,
        starts.data_ptr(),
        lens.data_ptr(),
        lens.shape[0],
        scale,
        torch.get_num_threads(),
    )
    if status:
        raise ValueError(f"paged attention: {_ERRORS.get(status, f'error {status}')}")
    return out


# Where the CPU has AMX tiles, torch's flash SDPA multiplies bf16 on them: it beat the two-matmul decode
# path 2.0-2.9x there (RESULTS.md issue 24, "Eighth round"), and the row kernel, 2.4x that path on Zen 5,
# has not been measured against it. So on such a CPU only steps whose longest query is at most this many
# rows take the row kernel: none until measured (``pf-rows-on-amx`` in benchmarks/cpu_path.py sets 16).
AMX_ROWS_MAX_QUERY = 0
# Without AVX-512 the kernel works in 8 lanes (its 16-lane form, two 256-bit halves whose 16-token
# reduction shuffled across them, ran 0.82-1.00x the torch path end to end: RESULTS.md issue 24
# "Eleventh round"). In 8 lanes, per call, it ran decodes 1.3-1.8x the torch path's attention (float32,
# SmolLM2's heads, 16-64 requests over 150-300 tokens) and prompts of 128 rows 0.85-0.96x; end to end,
# every step on it ran 1.01-1.09x the torch path and level with decode steps only (0.98-1.04x), so there
# every step takes it, whatever the cache dtype: a row's bits then depend on nothing but the row, which
# keeps float32 speculation exact ("Sixteenth round"). Since the seventeenth round's loops it runs
# decodes 2.0-3.5x and prompts 1.5-2.5x the torch path per call. False: every step on cpu_attention (the
# A/B). A CPU with neither AVX-512 nor AVX2 (other architectures included) keeps cpu_attention: not
# measured there.
AVX2_ROWS = True
# A float32 cache on AVX-512: the row kernel ran 0.98-0.99x the torch path end to end on the Zen 5 before
# the seventeenth round's loops and 1.06-1.08x after (batch 1-64, RESULTS.md issue 24, "Seventeenth
# round"), so every step takes it there too. False: float32 caches on cpu_attention (the A/B).
FLOAT32_ROWS = True
USE_NATIVE = True  # False: every step on the torch kernels (benchmarks' A/B, tests)


def _rows_fit(q: torch.Tensor, k_cache: torch.Tensor, query_start_loc: torch.Tensor) -> bool:
    """Every step of a bf16 cache on an AVX-512 CPU without AMX tiles; with them, steps of queries of at
    most ``AMX_ROWS_MAX_QUERY`` rows; with AVX2 but not AVX-512, every step with ``AVX2_ROWS``; a float32
    cache on AVX-512, ``FLOAT32_ROWS``; neither AVX-512 nor AVX2, none."""
    if not avx512():
        return AVX2_ROWS and avx2()
    if k_cache.dtype == torch.float32 and not FLOAT32_ROWS:
        return False
    if not amx_tiles():
        return True
    if q.shape[0] <= AMX_ROWS_MAX_QUERY:
        return True
    if AMX_ROWS_MAX_QUERY <= 0 or query_start_loc.numel() < 2:
        return False
    return int((query_start_loc[1:] - query_start_loc[:-1]).max()) <= AMX_ROWS_MAX_QUERY


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The torch backend's paged attention: the native row kernel where it can run and is the faster
    (every step of a bf16 cache on an AVX-512 CPU without AMX tiles; ``AMX_ROWS_MAX_QUERY``,
    ``AVX2_ROWS`` and ``FLOAT32_ROWS`` for the others), else cpu_attention."""
    args = (q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)
    if USE_NATIVE and available(q, k_cache) and _rows_fit(q, k_cache, query_start_loc):
        return paged_attention_rows(*args)
    return cpu_attention.paged_attention(*args)


def paged_attention_invariant(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Batch-invariant paged attention: the native row kernel (invariant by construction) where it can
    run, else ``invariant_attention`` (the torch path, one padded query row per batch entry)."""
    args = (q, k_cache, v_cache, block_tables, query_start_loc, seq_lens, scale)
    if USE_NATIVE and available(q, k_cache):
        return paged_attention_rows(*args)
    return invariant_attention.paged_attention_invariant(*args)
