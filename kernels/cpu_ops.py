"""The torch backend's norm, rotary and activation: the reference's arithmetic in fewer passes.

Why: at batch 16 on the CPU a third of a step went to elementwise ops, copies and indexing (issue 24's
profile), each its own pass over the activations and its own fresh tensor. These give results equal
bit for bit to ``kernels/reference.py`` (the oracle; tests/kernels/test_cpu_ops.py checks ``torch.equal``)
with fewer passes and temporaries:

- ``rms_norm``: torch's fused ``F.rms_norm`` (one pass, float32 accumulate) in float32; a bf16/fp16
  input of more than ``BLOCKS_FROM_ROWS`` rows (a prefill chunk) goes in row blocks of ``NORM_BLOCK_ROWS`` (the residual sum written straight into its output,
  each block's float32 copy normalised in cache and rounded once into the output, then the weight);
- ``rotary``: the cos/sin rows of a step's positions are gathered once, each half repeated over the
  whole head, and reused by every layer (the positions are compared by value); past
  ``BLOCKS_FROM_ROWS`` rows, per row block of ``ROTARY_BLOCK_ROWS``, ``x cos`` and ``x sin`` are two whole-head products and the two halves
  ``u1 - t2``, ``u2 + t1`` are rounded straight into one output (no ``cat``, no float32 output);
- ``silu_and_mul``: the gate's SiLU is multiplied by the up half in place; a bf16/fp16 input on the
  CPU with more than ``BLOCKS_FROM_ROWS`` rows goes in row blocks of ``SILU_BLOCK_ROWS``, so each float32 temporary stays in
  cache and is reused instead of a fresh tensor of the whole prefill chunk. Same arithmetic per
  element, so the result is the same bits.

Block sizes, measured 1 thread on SmolLM2's shapes at 4,096 rows (a batch-64 prefill chunk), bf16.
AMX Xeon (2 MiB L2), RESULTS.md issue 24 "Ninth round": SiLU 8.9 ms in blocks of 128 -> 7.1 ms in
blocks of 32 (16: 7.8, 64: 7.8); rotary of q and k 7.4 -> 4.9 ms; the norm with its residual
4.1 -> 3.2 ms; a batch-64 prefill 3.27-3.35 -> 3.05-3.07 CPU-s. Zen 4 (1 MiB L2), "Fifth round":
SiLU over 4,096 rows 42 -> 7.6 ms in blocks of 128; float32 gained nothing from blocks (0.8-1.1x),
so float32 keeps one pass for the norm and the SiLU. Up to ``BLOCKS_FROM_ROWS`` rows (decodes) the
block loop's extra slicing cost more than it saved (norm 15 -> 22 us and rotary 35 -> 45 us per call
at 1 row; a batch-1 decode 4.5 % slower), so those run whole as before. The block sizes are per
compute thread (times ``torch.get_num_threads()``: each thread's share of a block stays cache-sized);
with 2 threads, blocks of the 1-thread size made a batch-64 run 2 % slower, scaled ones 1.00x.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

_local = threading.local()
BLOCKS_FROM_ROWS = 128  # inputs of more rows go in row blocks; fewer run whole (fewer ops per call)
SILU_BLOCK_ROWS = 32
NORM_BLOCK_ROWS = 256
ROTARY_BLOCK_ROWS = 128


def _blocked(rows: int, x: torch.Tensor) -> bool:
    """Whether a bf16/fp16 CPU input of ``rows`` rows goes in row blocks (a prefill chunk, not a decode)."""
    return rows > BLOCKS_FROM_ROWS and x.device.type == "cpu" and x.dtype != torch.float32


def _block(rows_per_thread: int) -> int:
    """A block's rows: ``rows_per_thread`` for each compute thread, so each thread's share stays in cache."""
    return rows_per_thread * torch.get_num_threads()


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """``reference.rms_norm``: with a residual, the sum (rounded to x.dtype) is normalised and returned."""
    if (
        x.dim() == 2
        and _blocked(x.shape[0], x)
        and x.dtype == weight.dtype
        and (residual is None or residual.dtype == x.dtype)
    ):
        return _rms_norm_blocks(x, weight, eps, residual)
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


def _rms_norm_blocks(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """A bf16/fp16 norm in row blocks of ``NORM_BLOCK_ROWS``: each block's float32 copy stays in cache,
    and the normalised rows are rounded straight into the output (one rounding, as ``.to`` does)."""
    rows = x.shape[0]
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    new_residual = None if residual is None else torch.empty_like(out)
    step = _block(NORM_BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(rows, start + step)
        block = x[start:end]
        if residual is not None:
            assert new_residual is not None
            block = torch.add(block, residual[start:end], out=new_residual[start:end])
        xf = block.float()
        inv = torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True).add_(eps))
        torch.mul(xf, inv, out=out[start:end]).mul_(weight)
    return out if new_residual is None else (out, new_residual)


def _cos_sin(positions: torch.Tensor, cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float32 cos and sin of ``positions``, reused while the positions are equal: ``[T, 1, D/2]``, or for
    more than ``BLOCKS_FROM_ROWS`` positions ``[T, 1, D]`` with each half repeated (one multiply covers a
    whole head in ``_rotate_blocks``)."""
    last = getattr(_local, "rope", None)
    if last is not None and last[0] is cache and torch.equal(last[1], positions):
        return last[2], last[3]
    half = cache.shape[-1] // 2
    cs = cache.index_select(0, positions.long()).float()
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    if positions.shape[0] > BLOCKS_FROM_ROWS:
        cos, sin = torch.cat([cos, cos], dim=-1), torch.cat([sin, sin], dim=-1)
    else:
        cos, sin = cos.contiguous(), sin.contiguous()
    _local.rope = (cache, positions.clone(), cos, sin)
    return cos, sin


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox pairs (x[i], x[i + D/2]), the reference's float32 arithmetic, halves written in place."""
    if cos.shape[-1] == x.shape[-1]:
        return _rotate_blocks(x, cos, sin)
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


def _rotate_blocks(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """``_rotate`` in row blocks of ``ROTARY_BLOCK_ROWS``: ``u = x cos`` and ``t = x sin`` over whole
    heads, then ``u1 - t2`` and ``u2 + t1`` rounded straight into the output's halves."""
    rows, half = x.shape[0], x.shape[-1] // 2
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    step = _block(ROTARY_BLOCK_ROWS)
    for start in range(0, rows, step):
        end = min(rows, start + step)
        xf = x[start:end].float()
        t = xf * sin2[start:end]
        u = xf * cos2[start:end]
        torch.sub(u[..., :half], t[..., half:], out=out[start:end, ..., :half])
        torch.add(u[..., half:], t[..., :half], out=out[start:end, ..., half:])
    return out


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
    if not _blocked(rows.shape[0], x):
        xf = x.float()
        out = F.silu(xf[..., :half])
        out.mul_(xf[..., half:])
        return out.to(x.dtype)
    result = torch.empty(rows.shape[0], half, dtype=x.dtype)
    step = _block(SILU_BLOCK_ROWS)
    for start in range(0, rows.shape[0], step):
        block = rows[start : start + step].float()
        act = F.silu(block[:, :half])
        act.mul_(block[:, half:])
        result[start : start + step].copy_(act)
    return result.view(*x.shape[:-1], half)
