"""The native matvec of GGUF blocks (kernels/cpu_gguf_matvec.py) against the blocks dequantized by the
gguf package's own numpy code, in float64: the same weights, so only float32 rounding may differ."""

from __future__ import annotations

import platform

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from prefixflow.kernels import cpu_gguf_matvec, native_build

pytestmark = pytest.mark.skipif(not cpu_gguf_matvec.available(), reason="needs a C compiler and AVX2")


def blocks_of(kind: str, out: int, inp: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Blocks ``[out, inp / 32, bytes]`` packed by the gguf package, and their float64 weights."""
    data = np.random.default_rng(seed).standard_normal((out, inp)).astype(np.float32)
    raw = quants.quantize(data, Q[kind])
    weights = quants.dequantize(raw, Q[kind]).reshape(out, inp)
    return torch.from_numpy(raw.reshape(out, inp // 32, -1).copy()), torch.from_numpy(weights).double()


@pytest.mark.parametrize("kind", ["Q8_0", "Q4_0", "Q4_1"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 8, 9, 17, 64])
def test_equals_the_dequantized_product_to_float32_rounding(kind: str, rows: int) -> None:
    raw, w = blocks_of(kind, 70, 192)
    x = torch.randn(rows, 192)
    got = cpu_gguf_matvec.matvec(kind, raw, x)
    assert got is not None and got.dtype == torch.float32 and got.shape == (rows, 70)
    want = x.double() @ w.t()
    scale = (x.double().abs() @ w.abs().t()).max()
    assert float((got.double() - want).abs().max()) <= 1e-6 * float(scale)


def test_a_wrong_block_kind_is_far_off() -> None:
    """The check above can fail: Q4_1 blocks read as Q4_0 give other weights."""
    raw, w = blocks_of("Q4_1", 16, 64)
    x = torch.randn(1, 64)
    wrong = cpu_gguf_matvec.matvec("Q4_0", raw[..., 2:].contiguous(), x)
    assert wrong is not None and float((wrong.double() - x.double() @ w.t()).abs().max()) > 1e-2


def test_strided_rows_and_leading_dims() -> None:
    raw, w = blocks_of("Q4_1", 24, 96, seed=1)
    wide = torch.randn(2, 3, 200)
    x = wide[..., 10:106]  # rows 200 floats apart
    got = cpu_gguf_matvec.matvec("Q4_1", raw, x)
    assert got is not None and got.shape == (2, 3, 24)
    assert torch.equal(got, cpu_gguf_matvec.matvec("Q4_1", raw, x.contiguous()))
    assert torch.allclose(got.double(), x.double() @ w.t(), rtol=0, atol=1e-4)


def test_bits_do_not_depend_on_the_thread_count_or_the_other_rows_values() -> None:
    raw, _ = blocks_of("Q4_0", 200, 128, seed=2)
    for rows in (2, 6, 11):  # the codes' form, one pass of the weights' form, a pass and a remainder
        x = torch.randn(rows, 128)
        before = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            one = cpu_gguf_matvec.matvec("Q4_0", raw, x)
            torch.set_num_threads(2)
            two = cpu_gguf_matvec.matvec("Q4_0", raw, x)
        finally:
            torch.set_num_threads(before)
        assert one is not None and two is not None and torch.equal(one, two)
        others = torch.randn(rows, 128)
        others[rows - 1] = x[rows - 1]
        mates = cpu_gguf_matvec.matvec("Q4_0", raw, others)
        assert mates is not None and torch.equal(mates[rows - 1], one[rows - 1])


def test_calls_it_cannot_take_return_none() -> None:
    raw, _ = blocks_of("Q8_0", 8, 64)
    assert cpu_gguf_matvec.matvec("Q8_0", raw, torch.randn(1, 64, dtype=torch.bfloat16)) is None
    assert cpu_gguf_matvec.matvec("Q5_K", raw, torch.randn(1, 64)) is None
    assert cpu_gguf_matvec.matvec("Q8_0", raw, torch.randn(1, 96)) is None  # inputs do not match
    assert cpu_gguf_matvec.matvec("Q4_1", raw, torch.randn(1, 64)) is None  # 34-byte blocks are not Q4_1
    empty = cpu_gguf_matvec.matvec("Q8_0", raw, torch.randn(0, 64))
    assert empty is not None and empty.shape == (0, 8)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="an x86 build without AVX2")
def test_a_build_without_avx2_is_not_offered(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    """Scalar code would lose to the dense matmul, so a build without AVX2 reports itself unavailable
    (and the weight path stays dense)."""
    monkeypatch.setenv(native_build.MARCH_ENV, "x86-64")
    monkeypatch.setenv(native_build.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(native_build, "_loaded", {})
    cpu_gguf_matvec._built.cache_clear()
    try:
        assert not cpu_gguf_matvec.available()
        raw, _ = blocks_of("Q8_0", 8, 64)
        assert cpu_gguf_matvec.matvec("Q8_0", raw, torch.randn(1, 64)) is None
    finally:
        cpu_gguf_matvec._built.cache_clear()
