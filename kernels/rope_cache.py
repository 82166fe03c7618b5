"""Rotary-embedding cos/sin cache, including llama3 and linear frequency scaling.

Built once per model and stored in float32 (bf16 angles would be off by whole radians at long
positions); the kernels read it in float32 whatever the activations' dtype.
"""

from __future__ import annotations

import math
from typing import Any

import torch


def _scaling_type(rope_scaling: dict[str, Any] | None) -> str:
    """HF configs spell the scaling kind as "rope_type" (current) or "type" (older)."""
    if not rope_scaling:
        return "default"
    return str(rope_scaling.get("rope_type", rope_scaling.get("type", "default")))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict[str, Any]) -> torch.Tensor:
    """Llama 3.1 scaling: long wavelengths slowed by `factor`, short ones kept, a linear blend between.

    The blend weight is (original_ctx / wavelength - low) / (high - low), which is 0 at the
    low-frequency cut-off and 1 at the high-frequency cut-off.
    """
    factor = float(scaling["factor"])
    low = float(scaling.get("low_freq_factor", 1.0))
    high = float(scaling.get("high_freq_factor", 4.0))
    original_ctx = float(scaling.get("original_max_position_embeddings", 8192))

    wavelength = 2.0 * math.pi / inv_freq
    long_cutoff = original_ctx / low  # wavelengths above this are fully scaled
    short_cutoff = original_ctx / high  # wavelengths below this are untouched
    blend = ((original_ctx / wavelength) - low) / (high - low)
    blended = (1.0 - blend) * (inv_freq / factor) + blend * inv_freq

    out = torch.where(wavelength > long_cutoff, inv_freq / factor, inv_freq)
    in_between = (wavelength >= short_cutoff) & (wavelength <= long_cutoff)
    return torch.where(in_between, blended, out)


def rope_inv_freq(head_dim: int, theta: float, rope_scaling: dict[str, Any] | None = None) -> torch.Tensor:
    """Per-pair inverse frequencies [head_dim // 2] in float32 after any frequency scaling."""
    if head_dim % 2:
        raise ValueError(f"rotary head_dim must be even, got {head_dim}")
    exponents = torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim
    inv_freq = (1.0 / (float(theta) ** exponents)).to(torch.float32)
    kind = _scaling_type(rope_scaling)
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(rope_scaling["factor"])  # type: ignore[index]
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, rope_scaling)  # type: ignore[arg-type]
    raise NotImplementedError(f"rope_scaling type {kind!r} is not supported (default, linear, llama3)")


def build_rope_cache(
    head_dim: int, max_pos: int, theta: float, rope_scaling: dict[str, Any] | None = None
) -> torch.Tensor:
    """cos_sin_cache [max_pos, head_dim] = concat(cos, sin) of the half-dim angles, float32.

    The angles pos * inv_freq are formed in float64: in float32 they would carry up to ~1e-4 rad of
    rounding at position 4k and ~1e-2 rad at 128k, which no later precision can recover.
    """
    inv_freq = rope_inv_freq(head_dim, theta, rope_scaling).double()
    positions = torch.arange(max_pos, dtype=torch.float64)
    angles = torch.outer(positions, inv_freq)
    return torch.cat([angles.cos(), angles.sin()], dim=-1).float().contiguous()
