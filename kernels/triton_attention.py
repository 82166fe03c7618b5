"""Triton paged attention for the engine's mixed steps (prefill chunks + decodes in one flat batch).

Two paths behind one function:
- a varlen kernel over (query tile, kv head): a tile packs BLOCK_Q consecutive query tokens of one
  request times the GROUP query heads that share a KV head, so K/V are read once per group; it
  streams the request's cached context block by block (online softmax) with the causal mask;
- a split-KV decode kernel for decode-only steps whose (request, kv head) count is too small to fill
  the GPU: each program covers a slice of the context and a second kernel merges the slices by
  their log-sum-exp.

No host synchronisation: grid sizes come from tensor shapes only, so the call is CUDA-graph safe.
Precondition (the engine's invariant): every request in the batch has at least one query token.
"""

from __future__ import annotations

import functools
import math
import os

import torch
import triton
import triton.language as tl


def _interpreter_on() -> bool:
    """Whether @triton.jit in this process makes interpreted kernels (triton.knobs from 3.4 on)."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on")


INTERPRETED: bool = _interpreter_on()
_LOG2E = 1.4426950408889634


@triton.jit
def _find_request(query_start_loc_ptr, tile, num_reqs, BLOCK_Q: tl.constexpr):
    """Largest b whose first tile index (query_start_loc[b] // BLOCK_Q + b) is <= tile."""
    lo = 0
    hi = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        first_tile = tl.load(query_start_loc_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _dot(a, b, DOT_PREC: tl.constexpr, UPCAST: tl.constexpr):
    """tl.dot, or an fp32 dot under the interpreter, whose dot multiplies bf16 bit patterns as ints."""
    if UPCAST:
        c = tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    else:
        c = tl.dot(a, b, input_precision=DOT_PREC)
    return c


@triton.jit
def _attend_tile(
    q,
    acc,
    m_i,
    l_i,
    start,
    kv_end,
    q_pos,
    table,
    k_base,
    v_base,
    stride_kb,
    stride_ks,
    stride_vb,
    stride_vs,
    scale_log2,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    UPCAST: tl.constexpr,
    MASKED: tl.constexpr,
):
    """One online-softmax step over keys [start, start + BLOCK_N) of a request's paged context.

    k_base/v_base already point at this KV head. MASKED tiles apply `key < kv_end` and the causal
    `key <= q_pos`; unmasked tiles are wholly visible to every row (the bulk of a long context).
    """
    d = tl.arange(0, HEAD_DIM)
    n = start + tl.arange(0, BLOCK_N)
    if MASKED:
        n_ok = n < kv_end
        blk = tl.load(table + n // BLOCK_SIZE, mask=n_ok, other=0).to(tl.int64)
    else:
        blk = tl.load(table + n // BLOCK_SIZE).to(tl.int64)
    off = n % BLOCK_SIZE
    k_ptrs = k_base + blk[None, :] * stride_kb + off[None, :] * stride_ks + d[:, None]
    v_ptrs = v_base + blk[:, None] * stride_vb + off[:, None] * stride_vs + d[None, :]
    if MASKED:
        k = tl.load(k_ptrs, mask=n_ok[None, :], other=0.0)
        s = _dot(q, k, DOT_PREC, UPCAST) * scale_log2
        s = tl.where((n[None, :] <= q_pos[:, None]) & n_ok[None, :], s, float("-inf"))
    else:
        k = tl.load(k_ptrs)
        s = _dot(q, k, DOT_PREC, UPCAST) * scale_log2
    m_new = tl.maximum(m_i, tl.max(s, 1))
    p = tl.exp2(s - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    if MASKED:
        v = tl.load(v_ptrs, mask=n_ok[:, None], other=0.0)
    else:
        v = tl.load(v_ptrs)
    acc = acc * alpha[:, None] + _dot(p.to(v.dtype), v, DOT_PREC, UPCAST)
    return acc, m_new, l_i


@triton.jit
def _varlen_kernel(
    out_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale_log2,
    num_reqs,
    stride_qt,
    stride_qh,
    stride_ot,
    stride_oh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    GROUP: tl.constexpr,
    GROUP_P: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    UPCAST: tl.constexpr,
    UNMASKED_BULK: tl.constexpr,
):
    tile = tl.program_id(0)
    kv_head = tl.program_id(1)
    b = _find_request(query_start_loc_ptr, tile, num_reqs, BLOCK_Q)
    q_begin = tl.load(query_start_loc_ptr + b)
    q_len = tl.load(query_start_loc_ptr + b + 1) - q_begin
    q_tile = tile - (q_begin // BLOCK_Q + b)
    if q_tile * BLOCK_Q >= q_len:
        return  # spare tile of the over-provisioned grid
    ctx_before = tl.load(seq_lens_ptr + b) - q_len

    BLOCK_M: tl.constexpr = BLOCK_Q * GROUP_P
    rows = tl.arange(0, BLOCK_M)
    tok = q_tile * BLOCK_Q + rows // GROUP_P
    head = kv_head * GROUP + rows % GROUP_P
    row_ok = (tok < q_len) & (rows % GROUP_P < GROUP)
    d = tl.arange(0, HEAD_DIM)
    q_offs = (q_begin + tok).to(tl.int64)[:, None] * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)
    q_pos = ctx_before + tok

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    kv_end = ctx_before + tl.minimum(q_tile * BLOCK_Q + BLOCK_Q, q_len)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    if UNMASKED_BULK:
        # keys below the tile's first query position are visible to every row: no mask there
        full_end = ((ctx_before + q_tile * BLOCK_Q + 1) // BLOCK_N) * BLOCK_N
        for start in range(0, full_end, BLOCK_N):
            acc, m_i, l_i = _attend_tile(
                q,
                acc,
                m_i,
                l_i,
                start,
                kv_end,
                q_pos,
                table,
                k_base,
                v_base,
                stride_kb,
                stride_ks,
                stride_vb,
                stride_vs,
                scale_log2,
                BLOCK_N,
                HEAD_DIM,
                BLOCK_SIZE,
                DOT_PREC,
                UPCAST,
                False,
            )
    else:
        full_end = 0  # decode tiles: one loop keeps register use (and so occupancy) lower
    for start in range(full_end, kv_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q,
            acc,
            m_i,
            l_i,
            start,
            kv_end,
            q_pos,
            table,
            k_base,
            v_base,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            scale_log2,
            BLOCK_N,
            HEAD_DIM,
            BLOCK_SIZE,
            DOT_PREC,
            UPCAST,
            True,
        )
    acc = acc / l_i[:, None]
    o_offs = (q_begin + tok).to(tl.int64)[:, None] * stride_ot + head[:, None] * stride_oh + d[None, :]
    tl.store(out_ptr + o_offs, acc.to(out_ptr.dtype.element_ty), mask=row_ok[:, None])


@triton.jit
def _split_decode_kernel(
    part_out_ptr,
    part_lse_ptr,
    q_ptr,
    k_cache_ptr,
    v_cache_ptr,
    block_tables_ptr,
    query_start_loc_ptr,
    seq_lens_ptr,
    scale_log2,
    stride_qt,
    stride_qh,
    stride_kb,
    stride_ks,
    stride_kh,
    stride_vb,
    stride_vs,
    stride_vh,
    stride_bt,
    NUM_Q_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    DOT_PREC: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """One decode request x kv head x context slice; writes normalised partials and their lse."""
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    tok = tl.load(query_start_loc_ptr + b + 1) - 1  # the request's only (last) query token
    seq_len = tl.load(seq_lens_ptr + b)
    per_split = tl.cdiv(tl.cdiv(seq_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(lo + per_split, seq_len)

    rows = tl.arange(0, BLOCK_M)
    row_ok = rows < GROUP
    head = kv_head * GROUP + rows
    d = tl.arange(0, HEAD_DIM)
    q_offs = tok.to(tl.int64) * stride_qt + head[:, None] * stride_qh + d[None, :]
    q = tl.load(q_ptr + q_offs, mask=row_ok[:, None], other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    table = block_tables_ptr + b.to(tl.int64) * stride_bt
    k_base = k_cache_ptr + kv_head * stride_kh
    v_base = v_cache_ptr + kv_head * stride_vh
    q_pos = tl.zeros([BLOCK_M], tl.int32) + hi - 1  # the query sees its whole context
    full_end = lo + tl.maximum(hi - lo, 0) // BLOCK_N * BLOCK_N
    for start in range(lo, full_end, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q,
            acc,
            m_i,
            l_i,
            start,
            hi,
            q_pos,
            table,
            k_base,
            v_base,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            scale_log2,
            BLOCK_N,
            HEAD_DIM,
            BLOCK_SIZE,
            DOT_PREC,
            UPCAST,
            False,
        )
    for start in range(full_end, hi, BLOCK_N):
        acc, m_i, l_i = _attend_tile(
            q,
            acc,
            m_i,
            l_i,
            start,
            hi,
            q_pos,
            table,
            k_base,
            v_base,
            stride_kb,
            stride_ks,
            stride_vb,
            stride_vs,
            scale_log2,
            BLOCK_N,
            HEAD_DIM,
            BLOCK_SIZE,
            DOT_PREC,
            UPCAST,
            True,
        )

    empty = l_i == 0.0  # this slice lies past the end of the context
    acc = acc / tl.where(empty, 1.0, l_i)[:, None]
    lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
    base = (tok.to(tl.int64) * NUM_Q_HEADS + head) * NUM_SPLITS + split
    tl.store(part_lse_ptr + base, lse, mask=row_ok)
    tl.store(part_out_ptr + base[:, None] * HEAD_DIM + d[None, :], acc, mask=row_ok[:, None])


@triton.jit
def _merge_splits_kernel(
    out_ptr,
    part_out_ptr,
    part_lse_ptr,
    stride_ot,
    stride_oh,
    NUM_Q_HEADS: tl.constexpr,
    NUM_SPLITS: tl.constexpr,
    SPLITS_P: tl.constexpr,
    HEAD_DIM: tl.constexpr,
):
    """out = sum_s 2^(lse_s - lse_max) * o_s / sum_s 2^(lse_s - lse_max) for one (token, head)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, SPLITS_P)
    d = tl.arange(0, HEAD_DIM)
    base = (t * NUM_Q_HEADS + h) * NUM_SPLITS
    lse = tl.load(part_lse_ptr + base + s, mask=s < NUM_SPLITS, other=float("-inf"))
    o = tl.load(
        part_out_ptr + (base + s)[:, None] * HEAD_DIM + d[None, :], mask=(s < NUM_SPLITS)[:, None], other=0.0
    )
    w = tl.exp2(lse - tl.max(lse, 0))
    w = tl.where(s < NUM_SPLITS, w, 0.0)
    merged = tl.sum(o * w[:, None], 0) / tl.sum(w, 0)
    tl.store(out_ptr + t * stride_ot + h * stride_oh + d, merged.to(out_ptr.dtype.element_ty))


def _dot_precision(dtype: torch.dtype) -> str | None:
    """float32 inputs must not silently drop to tf32 on the GPU: the tests hold them to fp32 bounds."""
    return "ieee" if dtype == torch.float32 else None


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _auto_splits(q: torch.Tensor, num_reqs: int, num_kv_heads: int) -> int:
    """Enough context slices that (requests x kv heads x slices) covers ~2 waves of SMs, at most 16."""
    if q.device.type != "cuda":
        return 1
    sms = _num_sms(q.device.index if q.device.index is not None else torch.cuda.current_device())
    programs = num_reqs * num_kv_heads
    if programs >= sms:
        return 1
    return min(16, triton.next_power_of_2(math.ceil(2 * sms / programs)))


def _block_n(head_dim: int, interpreted: bool) -> int:
    """Keys per inner-loop tile (independent of the cache block size: columns look up their block)."""
    return 32 if interpreted or head_dim > 128 else 64


def varlen_tile(decode_only: bool, head_dim: int, group_p: int, interpreted: bool) -> tuple[int, int]:
    """(BLOCK_Q, num_warps) of the varlen kernel; a tile has BLOCK_Q * group_p >= 16 rows.

    Decode steps use 16-row tiles (one token's query heads; the MMA minimum); prefill/mixed steps
    128 rows with 8 warps (64 rows for head_dim 256), which compile without register spills on
    sm_90 (see tests/kernels/sm90_compile.py).
    """
    if decode_only:
        block_m, warps = 16, 4
    elif interpreted:
        block_m, warps = 32, 4
    else:
        block_m, warps = (128, 8) if head_dim <= 128 else (64, 4)
    return max(1, block_m // group_p), warps


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    *,
    out: torch.Tensor | None = None,
    num_kv_splits: int | None = None,
) -> torch.Tensor:
    """Contract of kernels.reference.paged_attention; `out` may be preallocated.

    num_kv_splits: None picks automatically; 1 forces the varlen kernel; >1 forces the split-KV
    decode path (only valid when every request has exactly one query token).
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_blocks, block_size, num_kv_heads, _ = k_cache.shape
    num_reqs = seq_lens.shape[0]
    group = num_q_heads // num_kv_heads
    if num_q_heads % num_kv_heads or head_dim & (head_dim - 1) or not 16 <= head_dim <= 256:
        raise ValueError(f"unsupported heads/head_dim: Hq={num_q_heads} Hkv={num_kv_heads} D={head_dim}")
    if out is None:
        out = torch.empty_like(q)
    if num_tokens == 0:
        return out
    assert q.stride(-1) == 1 and out.stride(-1) == 1 and k_cache.stride(-1) == 1 and v_cache.stride(-1) == 1
    group_p = triton.next_power_of_2(group)
    scale_log2 = float(scale) * _LOG2E
    prec = _dot_precision(q.dtype)
    upcast = INTERPRETED and q.dtype != torch.float32
    block_n = _block_n(head_dim, INTERPRETED)
    cache_strides = (*k_cache.stride()[:3], *v_cache.stride()[:3])

    decode_only = num_tokens == num_reqs
    splits = (
        num_kv_splits
        if num_kv_splits is not None
        else (_auto_splits(q, num_reqs, num_kv_heads) if decode_only else 1)
    )
    if splits > 1:
        if not decode_only:
            raise ValueError("split-KV path needs a decode-only batch (one query token per request)")
        part_out = torch.empty(
            (num_tokens, num_q_heads, splits, head_dim), device=q.device, dtype=torch.float32
        )
        part_lse = torch.empty((num_tokens, num_q_heads, splits), device=q.device, dtype=torch.float32)
        _split_decode_kernel[(num_reqs, num_kv_heads, splits)](
            part_out,
            part_lse,
            q,
            k_cache,
            v_cache,
            block_tables,
            query_start_loc,
            seq_lens,
            scale_log2,
            q.stride(0),
            q.stride(1),
            *cache_strides,
            block_tables.stride(0),
            NUM_Q_HEADS=num_q_heads,
            NUM_SPLITS=splits,
            GROUP=group,
            BLOCK_M=max(16, group_p),
            BLOCK_N=block_n,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=block_size,
            DOT_PREC=prec,
            UPCAST=upcast,
            num_warps=4,
        )
        _merge_splits_kernel[(num_tokens, num_q_heads)](
            out,
            part_out,
            part_lse,
            out.stride(0),
            out.stride(1),
            NUM_Q_HEADS=num_q_heads,
            NUM_SPLITS=splits,
            SPLITS_P=max(2, triton.next_power_of_2(splits)),
            HEAD_DIM=head_dim,
            num_warps=1 if INTERPRETED else 2,
        )
        return out

    block_q, warps = varlen_tile(decode_only, head_dim, group_p, INTERPRETED)
    grid = (num_tokens // block_q + num_reqs, num_kv_heads)
    _varlen_kernel[grid](
        out,
        q,
        k_cache,
        v_cache,
        block_tables,
        query_start_loc,
        seq_lens,
        scale_log2,
        num_reqs,
        q.stride(0),
        q.stride(1),
        out.stride(0),
        out.stride(1),
        *cache_strides,
        block_tables.stride(0),
        GROUP=group,
        GROUP_P=group_p,
        BLOCK_Q=block_q,
        BLOCK_N=block_n,
        HEAD_DIM=head_dim,
        BLOCK_SIZE=block_size,
        DOT_PREC=prec,
        UPCAST=upcast,
        UNMASKED_BULK=not decode_only,
        num_warps=warps,
        num_stages=2,
    )
    return out
