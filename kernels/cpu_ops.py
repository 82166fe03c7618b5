"""The torch backend's norm, rotary and activation: the reference's arithmetic in fewer passes.

Why: at batch 16 on the CPU a third of a step went to elementwise ops, copies and indexing (issue 24's
profile), each its own pass over the activations and its own fresh tensor. These give results equal
bit for bit to ``kernels/reference.py`` (the oracle; tests/kernels/test_cpu_ops.py checks ``torch.equal``)
with fewer passes and temporaries:

- ``rms_norm``: torch's fused ``F.rms_norm`` (one pass, float32 accumulate) for the normalisation;
  in bf16/fp16 it normalises the float32 copy and rounds before the weight, as the reference and
  transformers do;
- ``rotary``: the cos/sin rows of a step's positions are gathered once and reused by every layer
  (the positions are compared by value), and each half is written in place into one output, no
  ``cat``;
- ``silu_and_mul``: the gate's SiLU is multiplied by the up half in place; a bf16/fp16 input on the
  CPU with more than ``SILU_BLOCK_ROWS`` rows goes in row blocks, so each float32 temporary stays in
  cache and is reused instead of a fresh tensor of the whole prefill chunk. Measured on a 2-core Zen 4,
  1 thread, SmolLM2's 3072-wide gate|up in bf16: 4,096 rows 42 -> 7.6 ms, 512 rows 1.2 -> 1.0 ms,
  64 rows unchanged; float32 gained nothing (0.8-1.1x), so it keeps one pass (benchmarks/RESULTS.md
  issue 24, "Fifth round"). Same arithmetic per element, so the result is the same bits.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

_local = threading.local()
SILU_BLOCK_ROWS = 128


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``reference.rms_norm``: with a residual, the sum (rounded to x.dtype) is normalised and returned."""
    new_residual = None
    if residual is not None:
        new_residual = (
            x + residual if x.dtype == residual.dtype else (x.float() + residual.float()).to(x.dtype)
        )
        x = new_residual
    shape = (x.shape[-1],)
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        out = F.rms_norm(x, shape, weight, eps)
    else:
        out = (weight * F.rms_norm(x.float(), shape, None, eps).to(x.dtype)).to(x.dtype)
    return out if new_residual is None else (out, new_residual)


def _cos_sin(positions: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 ``[T, 1, D/2]`` cos and sin of ``positions``, reused while the positions are equal."""
    last = getattr(_local, "rope", None)
    if last is not None and last[0] is cache and torch.equal(last[1], positions):
        return last[2], last[3]
    half = cache.shape[-1] // 2
    cs = cache.index_select(0, positions.long()).float()
    cos, sin = cs[:, None, :half].contiguous(), cs[:, None, half:].contiguous()
    _local.rope = (cache, positions.clone(), cos, sin)
    return cos, sin


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox pairs (x[i], x[i + D/2]), the reference's float32 arithmetic, halves written in place."""
    half = x.shape[-1] // 2
    xf = x.float()
    x1, x2 = xf[..., :half], xf[..., half:]
    out = torch.empty(xf.shape, dtype=torch.float32, device=xf.device)
    o1, o2 = out[..., :half], out[..., half:]
    torch.mul(x1, cos, out=o1)
    o1.sub_(x2 * sin)
    torch.mul(x2, cos, out=o2)
    o2.add_(x1 * sin)
    return out.to(x.dtype)


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``reference.rotary``: neox-style rotary embedding of q [T, Hq, D] and k [T, Hkv, D]."""
    head_dim = q.shape[-1]
    if cos_sin_cache.shape[-1] != head_dim:
        raise ValueError(f"cos_sin_cache width {cos_sin_cache.shape[-1]} != head_dim {head_dim}")
    cos, sin = _cos_sin(positions, cos_sin_cache)
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``reference.silu_and_mul``: silu(x[:, :I]) * x[:, I:], float32 inside."""
    half = x.shape[-1] // 2
    rows = x.reshape(-1, x.shape[-1])
    if x.device.type != "cpu" or x.dtype == torch.float32 or rows.shape[0] <= SILU_BLOCK_ROWS:
        xf = x.float()
        out = F.silu(xf[..., :half])
        out.mul_(xf[..., half:])
        return out.to(x.dtype)
    result = torch.empty(rows.shape[0], half, dtype=x.dtype)
    for start in range(0, rows.shape[0], SILU_BLOCK_ROWS):
        block = rows[start : start + SILU_BLOCK_ROWS].float()
        act = F.silu(block[:, :half])
        act.mul_(block[:, half:])
        result[start : start + SILU_BLOCK_ROWS].copy_(act)
    return result.view(*x.shape[:-1], half)
