"""Fused residual-add + RMSNorm and SiLU-and-multiply: Triton against the reference, and the
reference against the plain formulas."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from prefixflow.kernels import reference
from tests.kernels.kernel_testlib import DEVICE, poisoned_like, relative_error

F32_BOUND = 1e-5


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.mark.parametrize("hidden", [64, 96])
def test_reference_rms_norm_formula(hidden: int) -> None:
    x, res, w = rand(5, hidden, seed=1), rand(5, hidden, seed=2), rand(hidden, seed=3)
    out, new_res = reference.rms_norm(x, w, 1e-6, res)
    s = x + res
    expected = s / torch.sqrt((s * s).mean(-1, keepdim=True) + 1e-6) * w
    assert relative_error(new_res, s) == 0.0
    assert relative_error(out, expected) < F32_BOUND
    assert relative_error(reference.rms_norm(x, w, 1e-6), reference.rms_norm(x, w, 1e-6, None)) == 0.0


@pytest.mark.parametrize("hidden", [64, 96])
@pytest.mark.parametrize("with_residual", [False, True])
def test_triton_rms_norm(hidden: int, with_residual: bool) -> None:
    triton_norm = pytest.importorskip("prefixflow.kernels.triton_norm")
    x, res, w = rand(7, hidden, seed=hidden), rand(7, hidden, seed=4), rand(hidden, seed=5)
    out = poisoned_like(x)
    if with_residual:
        res_out = poisoned_like(x)
        triton_norm.rms_norm(x, w, 1e-5, res, out=out, residual_out=res_out)
        ref_out, ref_res = reference.rms_norm(x, w, 1e-5, res)
        assert relative_error(res_out, ref_res) < F32_BOUND
    else:
        triton_norm.rms_norm(x, w, 1e-5, out=out)
        ref_out = reference.rms_norm(x, w, 1e-5)
    assert relative_error(out, ref_out) < F32_BOUND


def test_triton_bf16_rms_norm_and_silu() -> None:
    """bf16 in and out; the interpreter truncates float32 -> bf16 (GPUs round), hence a bf16 bound."""
    triton_norm = pytest.importorskip("prefixflow.kernels.triton_norm")
    triton_act = pytest.importorskip("prefixflow.kernels.triton_activation")
    x, res, w = (rand(7, 64, seed=s).bfloat16() for s in (7, 8, 9))
    out, res_out = poisoned_like(x), poisoned_like(x)
    triton_norm.rms_norm(x, w[0], 1e-5, res, out=out, residual_out=res_out)
    ref_out, ref_res = reference.rms_norm(x, w[0], 1e-5, res)
    assert out.dtype == res_out.dtype == torch.bfloat16
    assert relative_error(res_out, ref_res) < 1e-2 and relative_error(out, ref_out) < 2e-2
    act = poisoned_like(x[:, :32])
    triton_act.silu_and_mul(x, out=act)
    assert relative_error(act, reference.silu_and_mul(x)) < 2e-2


def test_reference_silu_and_mul_formula() -> None:
    x = rand(6, 2 * 48, seed=6)
    expected = F.silu(x[:, :48]) * x[:, 48:]
    assert relative_error(reference.silu_and_mul(x), expected) < F32_BOUND


@pytest.mark.parametrize("inter", [64, 80, 1500])
def test_triton_silu_and_mul(inter: int) -> None:
    triton_act = pytest.importorskip("prefixflow.kernels.triton_activation")
    x = 4 * rand(5, 2 * inter, seed=inter)  # wide range: exercises both saturation ends of the sigmoid
    out = poisoned_like(x[:, :inter])
    triton_act.silu_and_mul(x, out=out)
    assert relative_error(out, reference.silu_and_mul(x)) < F32_BOUND
