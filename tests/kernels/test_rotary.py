"""Rotary cache (default / linear / llama3 scaling) and neox rotation, against transformers and
against the complex-number form of the rotation."""

from __future__ import annotations

import math

import pytest
import torch

from prefixflow.kernels import build_rope_cache, reference
from prefixflow.kernels.rope_cache import rope_inv_freq
from tests.kernels.kernel_testlib import DEVICE, poisoned_like, relative_error

LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 8192,
}


def hf_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    """transformers' own rope init for the same parameters (an independent implementation)."""
    modeling_rope_utils = pytest.importorskip("transformers.modeling_rope_utils")
    from transformers import LlamaConfig

    params = (
        {"rope_type": "default", "rope_theta": theta} if scaling is None else {**scaling, "rope_theta": theta}
    )
    cfg = LlamaConfig(
        hidden_size=head_dim * 4,
        num_attention_heads=4,
        head_dim=head_dim,
        rope_parameters=params,
        max_position_embeddings=131072,
    )
    rope_type = params["rope_type"]
    if rope_type == "default":
        return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    inv_freq, _ = modeling_rope_utils.ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
    return inv_freq


@pytest.mark.parametrize(
    "scaling", [None, LLAMA3, {"type": "linear", "factor": 4.0}], ids=["default", "llama3", "linear"]
)
@pytest.mark.parametrize("head_dim", [64, 128])
def test_inv_freq_matches_transformers(scaling: dict | None, head_dim: int) -> None:
    ours = rope_inv_freq(head_dim, 500000.0, scaling)
    theirs = hf_inv_freq(head_dim, 500000.0, scaling)
    assert ours.dtype == torch.float32
    assert relative_error(ours, theirs) < 1e-6
    assert ((ours - theirs).abs() / theirs).max() < 1e-6  # per frequency, not just the largest


def test_llama3_scaling_changes_only_long_wavelengths() -> None:
    plain, scaled = rope_inv_freq(128, 500000.0), rope_inv_freq(128, 500000.0, LLAMA3)
    wavelength = 2 * math.pi / plain
    assert torch.equal(scaled[wavelength < 8192 / 4], plain[wavelength < 8192 / 4])
    assert torch.allclose(scaled[wavelength > 8192], plain[wavelength > 8192] / 8)


def test_cache_layout_is_cos_then_sin_of_position_times_freq() -> None:
    cache = build_rope_cache(64, 300, 10000.0, LLAMA3)
    inv = rope_inv_freq(64, 10000.0, LLAMA3).double()
    pos = torch.tensor([0, 1, 17, 299], dtype=torch.float64)
    angles = pos[:, None] * inv[None, :]
    assert cache.shape == (300, 64) and cache.dtype == torch.float32
    assert relative_error(cache[pos.long()], torch.cat([angles.cos(), angles.sin()], -1)) < 1e-5


def complex_rotate(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """Neox rotation as multiplication of (x[i] + j x[i + D/2]) by exp(j pos freq_i), in float64."""
    half = x.shape[-1] // 2
    z = torch.complex(x[..., :half].double(), x[..., half:].double())
    rot = torch.polar(
        torch.ones(1, dtype=torch.float64), positions.double()[:, None] * inv_freq.double()[None, :]
    )
    z = z * rot[:, None, :].to(z.device)
    return torch.cat([z.real, z.imag], dim=-1)


def rotary_inputs(head_dim: int, seed: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(9, 4, head_dim, generator=gen)
    k = torch.randn(9, 2, head_dim, generator=gen)
    positions = torch.randint(0, 4000, (9,), generator=gen)
    return q.to(DEVICE), k.to(DEVICE), positions.to(DEVICE)


@pytest.mark.parametrize("head_dim", [32, 64])
def test_reference_rotary_matches_complex_rotation(head_dim: int) -> None:
    q, k, positions = rotary_inputs(head_dim, seed=head_dim)
    cache = build_rope_cache(head_dim, 4096, 500000.0, LLAMA3).to(DEVICE)
    q_rot, k_rot = reference.rotary(q, k, positions, cache)
    inv = rope_inv_freq(head_dim, 500000.0, LLAMA3)
    assert relative_error(q_rot, complex_rotate(q, positions.cpu(), inv)) < 1e-5
    assert relative_error(k_rot, complex_rotate(k, positions.cpu(), inv)) < 1e-5


def test_reference_rotary_matches_transformers_apply() -> None:
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    q, k, positions = rotary_inputs(64, seed=1)
    cache = build_rope_cache(64, 4096, 10000.0, None).to(DEVICE)
    cos, sin = cache[positions].chunk(2, dim=-1)
    cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)  # HF repeats the half-dim angles
    hq, hk = llama.apply_rotary_pos_emb(q.transpose(0, 1), k.transpose(0, 1), cos, sin, unsqueeze_dim=0)
    q_rot, k_rot = reference.rotary(q, k, positions, cache)
    assert relative_error(q_rot, hq.transpose(0, 1)) < 1e-6
    assert relative_error(k_rot, hk.transpose(0, 1)) < 1e-6


@pytest.mark.parametrize("head_dim", [32, 64])
def test_triton_rotary(head_dim: int) -> None:
    triton_rotary = pytest.importorskip("prefixflow.kernels.triton_rotary")
    q, k, positions = rotary_inputs(head_dim, seed=head_dim + 1)
    cache = build_rope_cache(head_dim, 4096, 500000.0, LLAMA3).to(DEVICE)
    out = (poisoned_like(q), poisoned_like(k))
    triton_rotary.rotary(q, k, positions, cache, out=out)
    q_ref, k_ref = reference.rotary(q, k, positions, cache)
    assert relative_error(out[0], q_ref) < 1e-5
    assert relative_error(out[1], k_ref) < 1e-5
