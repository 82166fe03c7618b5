"""The CPU dense matmul (kernels/cpu_linear.py): oneDNN-prepacked bf16 weights give the reference's
result up to the summation order where the CPU's oneDNN can prepack them; elsewhere the choice falls back to
``F.linear`` and says why. Float32 never prepacks (its tests pin exact numerics)."""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels import cpu_linear

PREPACK_REASON = cpu_linear.prepack_unsupported(torch.bfloat16)
needs_prepack = pytest.mark.skipif(
    PREPACK_REASON is not None, reason=f"no oneDNN bf16 prepack: {PREPACK_REASON}"
)


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) / shape[-1] ** 0.5


def test_the_choice_follows_the_probe_and_float32_never_prepacks() -> None:
    assert cpu_linear.linear_kernel("cuda", "bfloat16") is None
    f32 = cpu_linear.linear_kernel("cpu", "float32")
    assert f32 is not None and f32.kernel == cpu_linear.PLAIN
    bf16 = cpu_linear.linear_kernel("cpu", "bfloat16")
    assert bf16 is not None
    assert (bf16.kernel == cpu_linear.PREPACKED) == (PREPACK_REASON is None)
    if PREPACK_REASON is not None:
        assert bf16.reason == PREPACK_REASON  # the fallback names what is missing
    assert cpu_linear.prepack_unsupported(torch.float16) is not None  # only bf16 is prepacked


@needs_prepack
@pytest.mark.parametrize("rows", [1, 15, 16, 64, 130])
def test_prepacked_bf16_equals_reference_up_to_rounding(rows: int) -> None:
    w, x, b = rand(96, 64, seed=1).bfloat16(), rand(rows, 64, seed=2).bfloat16(), rand(96, seed=3).bfloat16()
    packed = cpu_linear.prepack(w)
    for bias in (None, b):
        got = cpu_linear.prepacked_linear(x, packed, bias)
        want = cpu_linear.reference_linear(x, w, bias)
        assert got.dtype == torch.bfloat16 and got.shape == want.shape
        torch.testing.assert_close(got.float(), want.float(), rtol=1.6e-2, atol=1e-2)
    three_d = cpu_linear.prepacked_linear(x.reshape(1, rows, 64), packed, None)
    assert torch.equal(three_d.reshape(rows, 96), cpu_linear.prepacked_linear(x, packed, None))


@pytest.mark.parametrize("rows", [1, 16, 130])
def test_the_prepacked_op_equals_reference_in_float32(rows: int) -> None:
    """oneDNN prepacks float32 on any x86 CPU, so the op's shapes and bias run even where bf16 cannot."""
    w, x, b = rand(96, 64, seed=1), rand(rows, 64, seed=2), rand(96, seed=3)
    packed = cpu_linear.prepack(w)
    assert packed.nbytes == w.numel() * 4 and packed.out_features == 96
    for bias in (None, b):
        got = cpu_linear.prepacked_linear(x.reshape(1, rows, 64), packed, bias)
        assert got.shape == (1, rows, 96)
        torch.testing.assert_close(got[0], cpu_linear.reference_linear(x, w, bias), rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="65 features"):
        cpu_linear.prepacked_linear(rand(2, 65, seed=6), packed, None)


@pytest.mark.parametrize("rows", [1, 7, 8, 16, 70])
@pytest.mark.parametrize("out_features", [96, cpu_linear.CHUNK_MIN_OUT, cpu_linear.CHUNK_MIN_OUT + 5])
@pytest.mark.parametrize("with_bias", [False, True])
def test_dense_linear_equals_f_linear_bit_for_bit(rows: int, out_features: int, with_bias: bool) -> None:
    """Column chunks (a last partial one included) compute each output's dot product as F.linear does."""
    w, x = rand(out_features, 64, seed=7), rand(rows, 64, seed=8)
    bias = rand(out_features, seed=9) if with_bias else None
    with torch.inference_mode():
        got = cpu_linear.dense_linear(x, w, bias)
    assert torch.equal(got, cpu_linear.reference_linear(x, w, bias))


def test_dense_linear_chunks_only_wide_float32_layers_at_enough_rows(monkeypatch) -> None:
    calls: list[tuple[int, ...]] = []
    real_mm = torch.mm

    def counting_mm(a: torch.Tensor, b: torch.Tensor, **kw: torch.Tensor) -> torch.Tensor:
        calls.append(tuple(b.shape))
        return real_mm(a, b, **kw)

    monkeypatch.setattr(torch, "mm", counting_mm)
    w = rand(cpu_linear.CHUNK_MIN_OUT, 64, seed=10)
    with torch.inference_mode():
        cpu_linear.dense_linear(rand(16, 64, seed=11), w)
        assert calls == [(64, cpu_linear.CHUNK)] * 2 + [(64, cpu_linear.CHUNK_MIN_OUT - 2 * cpu_linear.CHUNK)]
        calls.clear()
        cpu_linear.dense_linear(rand(1, 64, seed=12), w)  # one row: one F.linear
        cpu_linear.dense_linear(rand(16, 64, seed=13).bfloat16(), w.bfloat16())  # not float32
    assert calls == []
