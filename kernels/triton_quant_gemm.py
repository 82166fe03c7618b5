"""Triton W4A16 / W8A16 GEMM: ``x [M, K] @ W^T`` with W a ``PackedWeight``, dequantized in registers.

Two launch shapes over one dequantizing tile loader:
- tiled (prefill, M > 16): a (M tile, N tile) grid; each program streams K in BLOCK_K steps;
- split-K (decode, M <= 16): an (N tile, K split) grid with one 16-row M tile, so a batch of 1-16
  tokens still spreads the weight read over every SM; partial sums go to a float32 scratch
  ``[splits, M, N]`` summed afterwards (deterministic, no atomics, CUDA-graph safe).

The loader reads ``BLOCK_K / pack`` packed int32 rows and unpacks them with a broadcast shift
(``[rows, pack, BLOCK_N] -> [BLOCK_K, BLOCK_N]``), so each packed word is loaded once. Group scales,
zeros and mins are gathered by ``g_idx`` (act-order) or ``k // GROUP``; when a K tile lies inside one
group (no g_idx, GROUP a multiple of BLOCK_K) a single row of them is loaded.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from prefixflow.kernels.quant_weight import PackedWeight
from prefixflow.kernels.triton_attention import INTERPRETED

SMALL_M = 16


@triton.jit
def _dequant_tile(
    qw_ptr,
    s_ptr,
    z_ptr,
    m_ptr,
    g_ptr,
    k0,
    offs_n,
    K,
    N,
    stride_qk,
    stride_sg,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    DEFAULT_ZERO: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_M: tl.constexpr,
    HAS_G: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """Float32 weights W^T[k0:k0+BLOCK_K, offs_n]; rows k >= K come out 0."""
    PACK: tl.constexpr = 32 // BITS
    ROWS: tl.constexpr = BLOCK_K // PACK
    rows = k0 // PACK + tl.arange(0, ROWS)
    n_ok = offs_n < N
    packed = tl.load(
        qw_ptr + rows[:, None] * stride_qk + offs_n[None, :],
        mask=(rows[:, None] < (K + PACK - 1) // PACK) & n_ok[None, :],
        other=0,
    )
    shifts = tl.arange(0, PACK) * BITS
    q = (packed[:, None, :] >> shifts[None, :, None]) & ((1 << BITS) - 1)
    q = tl.reshape(q, (BLOCK_K, BLOCK_N)).to(tl.float32)
    offs_k = k0 + tl.arange(0, BLOCK_K)
    k_ok = offs_k < K
    if HAS_G:
        g = tl.load(g_ptr + offs_k, mask=k_ok, other=0)
        gmask = k_ok[:, None] & n_ok[None, :]
        sg = g[:, None] * stride_sg + offs_n[None, :]
    elif GROUP % BLOCK_K == 0:
        gmask = n_ok[None, :]
        sg = (k0 // GROUP) * stride_sg + offs_n[None, :]
    else:
        gmask = k_ok[:, None] & n_ok[None, :]
        sg = (offs_k // GROUP)[:, None] * stride_sg + offs_n[None, :]
    s = tl.load(s_ptr + sg, mask=gmask, other=0.0).to(tl.float32)
    if HAS_Z:
        z = tl.load(z_ptr + sg, mask=gmask, other=0.0).to(tl.float32)
        w = (q - z) * s
    else:
        w = (q - DEFAULT_ZERO) * s
    if HAS_M:
        w += tl.load(m_ptr + sg, mask=gmask, other=0.0).to(tl.float32)
    return tl.where(k_ok[:, None], w, 0.0)


@triton.jit
def _tile_product(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    m_ptr,
    g_ptr,
    offs_m,
    offs_n,
    k_begin,
    k_end,
    M,
    N,
    K,
    stride_xm,
    stride_qk,
    stride_sg,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    DEFAULT_ZERO: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_M: tl.constexpr,
    HAS_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    """Float32 ``x[offs_m, k_begin:k_end] @ W^T[k_begin:k_end, offs_n]``."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_begin, k_end, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(
            x_ptr + offs_m[:, None] * stride_xm + offs_k[None, :],
            mask=(offs_m[:, None] < M) & (offs_k[None, :] < K),
            other=0.0,
        )
        w = _dequant_tile(
            qw_ptr,
            s_ptr,
            z_ptr,
            m_ptr,
            g_ptr,
            k0,
            offs_n,
            K,
            N,
            stride_qk,
            stride_sg,
            BITS,
            GROUP,
            DEFAULT_ZERO,
            HAS_Z,
            HAS_M,
            HAS_G,
            BLOCK_K,
            BLOCK_N,
        )
        if UPCAST:  # float32 activations (and the interpreter, whose dot mishandles 16-bit floats)
            acc += tl.dot(x.to(tl.float32), w, input_precision="ieee")
        else:
            acc += tl.dot(x, w.to(x.dtype))
    return acc


@triton.jit
def _tiled_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    m_ptr,
    g_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_om,
    stride_qk,
    stride_sg,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    DEFAULT_ZERO: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_M: tl.constexpr,
    HAS_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    acc = _tile_product(
        x_ptr,
        qw_ptr,
        s_ptr,
        z_ptr,
        m_ptr,
        g_ptr,
        offs_m,
        offs_n,
        0,
        K,
        M,
        N,
        K,
        stride_xm,
        stride_qk,
        stride_sg,
        BITS,
        GROUP,
        DEFAULT_ZERO,
        HAS_Z,
        HAS_M,
        HAS_G,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        UPCAST,
    )
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(
        out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mask
    )


@triton.jit
def _split_k_kernel(
    x_ptr,
    qw_ptr,
    s_ptr,
    z_ptr,
    m_ptr,
    g_ptr,
    part_ptr,
    M,
    N,
    K,
    K_PER_SPLIT,
    stride_xm,
    stride_qk,
    stride_sg,
    BITS: tl.constexpr,
    GROUP: tl.constexpr,
    DEFAULT_ZERO: tl.constexpr,
    HAS_Z: tl.constexpr,
    HAS_M: tl.constexpr,
    HAS_G: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    UPCAST: tl.constexpr,
):
    offs_m = tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    split = tl.program_id(1)
    k_begin = split * K_PER_SPLIT
    k_end = tl.minimum(k_begin + K_PER_SPLIT, K)
    acc = _tile_product(
        x_ptr,
        qw_ptr,
        s_ptr,
        z_ptr,
        m_ptr,
        g_ptr,
        offs_m,
        offs_n,
        k_begin,
        k_end,
        M,
        N,
        K,
        stride_xm,
        stride_qk,
        stride_sg,
        BITS,
        GROUP,
        DEFAULT_ZERO,
        HAS_Z,
        HAS_M,
        HAS_G,
        BLOCK_M,
        BLOCK_N,
        BLOCK_K,
        UPCAST,
    )
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    ptrs = part_ptr + split * M * N + offs_m[:, None] * N + offs_n[None, :]
    tl.store(ptrs, acc, mask=mask)


def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).multi_processor_count)
    return 4


def pick_splits(n: int, k: int, block_n: int, block_k: int, device: torch.device) -> int:
    """Enough K splits that (N tiles x splits) covers about two waves of the SMs."""
    n_tiles = triton.cdiv(n, block_n)
    k_tiles = triton.cdiv(k, block_k)
    want = triton.cdiv(2 * _sm_count(device), n_tiles)
    return max(1, min(k_tiles, triton.next_power_of_2(want)))


def quant_linear(
    x: torch.Tensor,
    w: PackedWeight,
    bias: torch.Tensor | None = None,
    *,
    split_k: int | None = None,
    block_k: int | None = None,
) -> torch.Tensor:
    """``x @ dequantize(w).T + bias`` in ``x.dtype``; the contract of ``quant_weight.quant_linear_reference``.

    ``split_k``: None picks the split-K kernel for M <= 16 with an automatic split count, 0 forces
    the tiled kernel, n >= 1 forces split-K with n splits (tests use these). ``block_k`` overrides
    the K tile (a multiple of 32).
    """
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    m, k = x2.shape
    n = w.out_features
    if k != w.in_features:
        raise ValueError(f"x has {k} features, the weight expects {w.in_features}")
    upcast = INTERPRETED or x2.dtype == torch.float32
    bk = block_k or (64 if w.group_size % 64 == 0 or w.g_idx is not None else 32)
    z = w.zeros if w.zeros is not None else w.scales
    mins = w.mins if w.mins is not None else w.scales
    g = w.g_idx if w.g_idx is not None else w.scales
    consts = dict(
        BITS=w.bits,
        GROUP=w.group_size,
        DEFAULT_ZERO=w.default_zero,
        HAS_Z=w.zeros is not None,
        HAS_M=w.mins is not None,
        HAS_G=w.g_idx is not None,
        BLOCK_K=bk,
        UPCAST=upcast,
    )
    strides = (w.qweight.stride(0), w.scales.stride(0))
    use_split = (split_k is None and m <= SMALL_M) or (split_k is not None and split_k >= 1)
    if use_split and m <= SMALL_M:
        block_n = 64
        splits = split_k or pick_splits(n, k, block_n, bk, x.device)
        per_split = triton.cdiv(triton.cdiv(k, splits), bk) * bk
        splits = triton.cdiv(k, per_split)
        part = torch.empty((splits, m, n), device=x.device, dtype=torch.float32)
        _split_k_kernel[(triton.cdiv(n, block_n), splits)](
            x2,
            w.qweight,
            w.scales,
            z,
            mins,
            g,
            part,
            m,
            n,
            k,
            per_split,
            x2.stride(0),
            *strides,
            BLOCK_M=SMALL_M,
            BLOCK_N=block_n,
            num_warps=4,
            **consts,
        )
        out = part.sum(0)
        if bias is not None:
            out += bias.float()
        return out.to(x.dtype).reshape(*lead, n)
    block_m, block_n = (32, 64) if INTERPRETED else (64, 128)
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    _tiled_kernel[(triton.cdiv(m, block_m), triton.cdiv(n, block_n))](
        x2,
        w.qweight,
        w.scales,
        z,
        mins,
        g,
        out,
        m,
        n,
        k,
        x2.stride(0),
        out.stride(0),
        *strides,
        BLOCK_M=block_m,
        BLOCK_N=block_n,
        num_warps=4 if INTERPRETED else 8,
        num_stages=3,
        **consts,
    )
    if bias is not None:
        out += bias
    return out.reshape(*lead, n)
