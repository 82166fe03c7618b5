"""Triton neox-style rotary embedding for q and k of one step, reading the cos/sin cache by position."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_heads(
    src_ptr,
    dst_ptr,
    t,
    stride_st,
    stride_sh,
    stride_dt,
    stride_dh,
    cos,
    sin,
    NUM_HEADS: tl.constexpr,
    HEADS_P: tl.constexpr,
    HALF: tl.constexpr,
):
    """Rotate every head of token t: (x1, x2) -> (x1 cos - x2 sin, x2 cos + x1 sin)."""
    h = tl.arange(0, HEADS_P)[:, None]
    i = tl.arange(0, HALF)[None, :]
    mask = h < NUM_HEADS
    src = src_ptr + t * stride_st + h * stride_sh + i
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    dst = dst_ptr + t * stride_dt + h * stride_dh + i
    ty = dst_ptr.dtype.element_ty
    tl.store(dst, (x1 * cos - x2 * sin).to(ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_out_ptr,
    k_out_ptr,
    q_ptr,
    k_ptr,
    pos_ptr,
    cache_ptr,
    stride_qt,
    stride_qh,
    stride_kt,
    stride_kh,
    stride_qot,
    stride_qoh,
    stride_kot,
    stride_koh,
    stride_cache,
    NUM_Q_HEADS: tl.constexpr,
    NUM_KV_HEADS: tl.constexpr,
    QH_P: tl.constexpr,
    KH_P: tl.constexpr,
    HALF: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(pos_ptr + t).to(tl.int64)
    i = tl.arange(0, HALF)[None, :]
    cos = tl.load(cache_ptr + pos * stride_cache + i).to(tl.float32)
    sin = tl.load(cache_ptr + pos * stride_cache + HALF + i).to(tl.float32)
    _rotate_heads(
        q_ptr, q_out_ptr, t, stride_qt, stride_qh, stride_qot, stride_qoh, cos, sin, NUM_Q_HEADS, QH_P, HALF
    )
    _rotate_heads(
        k_ptr, k_out_ptr, t, stride_kt, stride_kh, stride_kot, stride_koh, cos, sin, NUM_KV_HEADS, KH_P, HALF
    )


def rotary(
    q: torch.Tensor,
    k: torch.Tensor,
    positions: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    *,
    out: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract of kernels.reference.rotary; `out` may name preallocated (q_out, k_out), even q and k."""
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    half = head_dim // 2
    if cos_sin_cache.shape[-1] != head_dim or half & (half - 1):
        raise ValueError(f"need a power-of-two head_dim matching the cache, got {head_dim}")
    q_out, k_out = out if out is not None else (torch.empty_like(q), torch.empty_like(k))
    if num_tokens:
        assert q.stride(-1) == 1 and k.stride(-1) == 1 and cos_sin_cache.stride(-1) == 1
        _rotary_kernel[(num_tokens,)](
            q_out,
            k_out,
            q,
            k,
            positions,
            cos_sin_cache,
            q.stride(0),
            q.stride(1),
            k.stride(0),
            k.stride(1),
            q_out.stride(0),
            q_out.stride(1),
            k_out.stride(0),
            k_out.stride(1),
            cos_sin_cache.stride(0),
            NUM_Q_HEADS=num_q_heads,
            NUM_KV_HEADS=num_kv_heads,
            QH_P=triton.next_power_of_2(num_q_heads),
            KH_P=triton.next_power_of_2(num_kv_heads),
            HALF=half,
            num_warps=4,
        )
    return q_out, k_out
