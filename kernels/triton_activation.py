"""Triton SiLU-and-multiply: the SwiGLU gate over the fused gate/up projection output."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _silu_and_mul_kernel(out_ptr, x_ptr, stride_x, stride_o, INTER: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < INTER
    gate = tl.load(x_ptr + row * stride_x + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * stride_x + INTER + cols, mask=mask, other=0.0).to(tl.float32)
    silu = gate / (1.0 + tl.exp(-gate))
    tl.store(out_ptr + row * stride_o + cols, (silu * up).to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
    """Contract of kernels.reference.silu_and_mul; `out` [T, I] may be preallocated."""
    inter = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * inter)
    if out is None:
        out = torch.empty((*x.shape[:-1], inter), device=x.device, dtype=x.dtype)
    out2 = out.view(-1, inter)
    if x2.shape[0]:
        assert x2.stride(-1) == 1 and out2.stride(-1) == 1
        block = min(1024, triton.next_power_of_2(inter))
        _silu_and_mul_kernel[(x2.shape[0], triton.cdiv(inter, block))](
            out2, x2, x2.stride(0), out2.stride(0), INTER=inter, BLOCK=block, num_warps=4
        )
    return out
