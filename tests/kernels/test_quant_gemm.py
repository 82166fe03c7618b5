"""Weight-only int4/int8 and fp8 W8A8 kernels against the torch reference (``kernels/quant_weight.py``).

Triton runs under its interpreter here (tests/kernels/conftest.py); the CPU kernels are torch ops.
Shapes are small and deliberately ragged: K not a multiple of the K tile or of the group, N not a
multiple of the N tile, act-order ``g_idx`` permuting the groups.
"""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels.fp8_linear import (
    FP8,
    Fp8Weight,
    fp8_linear_reference,
    quantize_fp8_rows,
    widen_fp8,
)
from prefixflow.kernels.quant_cpu import DequantChunks, Int4Pack, Int8Pack, select_cpu_kernel
from prefixflow.kernels.quant_weight import (
    PackedWeight,
    dequantize,
    pack_along_rows,
    quant_linear_reference,
    unpack_rows,
)


def packed(k: int, n: int, bits: int, group: int, *, zeros=True, mins=False, act_order=False, seed=0):
    gen = torch.Generator().manual_seed(seed)
    groups = -(-k // group)
    q = torch.randint(0, 2**bits, (k, n), generator=gen)
    scales = (torch.rand(groups, n, generator=gen) * 0.02 + 0.002).half()
    z = torch.randint(0, 2**bits, (groups, n), generator=gen).half() if zeros else None
    m = (torch.randn(groups, n, generator=gen) * 0.01).half() if mins else None
    g_idx = None
    if act_order:  # the k-th input of the permuted order falls in group k // group
        perm = torch.randperm(k, generator=gen)
        g_idx = torch.empty(k, dtype=torch.int32)
        g_idx[perm] = (torch.arange(k) // group).int()
    return PackedWeight(pack_along_rows(q, bits), scales, bits, k, group, z, -1, m, g_idx)


def close(got: torch.Tensor, want: torch.Tensor, rel: float) -> None:
    scale = want.abs().max().item() + 1e-6
    err = (got.float() - want.float()).abs().max().item()
    assert err <= rel * scale, (err, scale)


def test_pack_unpack_round_trip_and_reference_formula():
    q = torch.randint(0, 16, (45, 7))
    words = pack_along_rows(q, 4)
    assert words.shape == (6, 7) and torch.equal(unpack_rows(words, 4, 45), q.int())
    assert torch.equal(unpack_rows(pack_along_rows(q * 17, 8), 8, 45), (q * 17).int())
    w = packed(45, 7, 4, 16, mins=True, act_order=True)
    groups = w.g_idx.long()
    want = unpack_rows(w.qweight, 4, 45).float() - w.zeros.float()[groups]
    want = (want * w.scales.float()[groups] + w.mins.float()[groups]).t()
    assert torch.equal(dequantize(w), want)


# ---------------------------------------------------------------- Triton (interpreted on CPU)

CASES = [  # (bits, M, K, N, group, act_order, mins, split_k)
    (4, 1, 200, 96, 64, False, False, None),  # split-K, K tail
    (4, 7, 200, 96, 64, True, False, 3),  # split-K forced, act-order
    (4, 7, 200, 96, 32, False, True, 0),  # tiled forced, mins (GGUF Q4_1 shape)
    (4, 64, 136, 72, 128, True, False, None),  # tiled, partial last group, act-order
    (8, 1, 200, 96, 200, False, False, None),  # per-channel int8
    (8, 7, 200, 96, 64, True, False, 2),
    (8, 64, 136, 72, 32, False, False, None),
]


@pytest.mark.parametrize(("bits", "m", "k", "n", "group", "act_order", "mins", "split_k"), CASES)
def test_triton_quant_gemm_matches_reference(bits, m, k, n, group, act_order, mins, split_k):
    from prefixflow.kernels.triton_quant_gemm import quant_linear

    w = packed(k, n, bits, group, mins=mins, act_order=act_order, seed=m)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(1))
    bias = torch.randn(n)
    close(quant_linear(x, w, bias, split_k=split_k), quant_linear_reference(x, w, bias), 1e-5)


def test_triton_quant_gemm_bfloat16_activations_and_batch_dims():
    from prefixflow.kernels.triton_quant_gemm import quant_linear

    w = packed(96, 64, 4, 32, zeros=False)
    x = torch.randn(2, 3, 96).bfloat16()
    got = quant_linear(x, w)
    assert got.shape == (2, 3, 64) and got.dtype == torch.bfloat16
    close(got, quant_linear_reference(x.float(), w), 2e-2)


# ---------------------------------------------------------------- CPU kernels


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(
    ("group", "act_order", "mins"), [(32, False, True), (64, True, False), (128, False, False)]
)
def test_cpu_dequant_kernel_matches_reference_in_float32(bits, group, act_order, mins):
    w = packed(200, 48, bits, group, mins=mins, act_order=act_order)  # 200: a partial last group
    x = torch.randn(5, 200)
    kernel = select_cpu_kernel(w, torch.float32)
    assert isinstance(kernel, DequantChunks)  # torch's pack ops have no fast float32 path
    close(kernel(x), quant_linear_reference(x, w), 1e-6)


def test_cpu_pack_kernels_in_bfloat16():
    x = torch.randn(9, 256)
    int4 = packed(256, 64, 4, 64, act_order=True)
    kernel = select_cpu_kernel(int4, torch.bfloat16)
    assert isinstance(kernel, Int4Pack)
    close(kernel(x.bfloat16()), quant_linear_reference(x, int4), 2e-2)

    int8 = packed(264, 48, 8, 264)  # K % 16 != 0: the op needs padding (it crashes otherwise)
    kernel = select_cpu_kernel(int8, torch.bfloat16)
    assert isinstance(kernel, Int8Pack)
    x8 = torch.randn(3, 264)
    close(kernel(x8.bfloat16()), quant_linear_reference(x8, int8), 2e-2)

    grouped8 = packed(256, 48, 8, 64)  # int8 with groups: no torch op, dequantized in chunks
    assert isinstance(select_cpu_kernel(grouped8, torch.bfloat16), DequantChunks)
    odd_n = packed(256, 40, 4, 64)  # the int4 op needs N % 16 == 0
    assert isinstance(select_cpu_kernel(odd_n, torch.bfloat16), DequantChunks)


# ---------------------------------------------------------------- fp8


def test_widen_fp8_is_exact_for_every_code():
    codes = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    want = codes.view(FP8).float()
    got = widen_fp8(codes).float() * 256.0
    finite = ~torch.isnan(want)
    assert torch.equal(got[finite], want[finite])


def test_fp8_reference_performs_both_roundings():
    gen = torch.Generator().manual_seed(0)
    w = torch.randn(40, 64, generator=gen)
    scale = w.abs().amax(1) / 448.0
    weight = Fp8Weight((w / scale[:, None]).to(FP8), scale)
    x = torch.randn(6, 64, generator=gen) * torch.logspace(-2, 2, 6)[:, None]  # very different row scales
    xq, sx = quantize_fp8_rows(x)
    want = (xq.float() * sx) @ (weight.weight.float() * scale[:, None]).t()
    close(fp8_linear_reference(x, weight), want, 1e-6)
    assert (fp8_linear_reference(x, weight) - x @ w.t()).abs().max() < 0.1 * (x @ w.t()).abs().max()


@pytest.mark.parametrize("bits", [4, 8])
def test_cpu_kernel_for_groups_of_unequal_size(bits):
    """One tensor-parallel rank of an act-order layer: its inputs draw unevenly on the groups."""
    w = packed(96, 32, bits, 16, mins=True)
    uneven = torch.randint(0, w.scales.shape[0], (96,), generator=torch.Generator().manual_seed(3)).int()
    w = PackedWeight(w.qweight, w.scales, bits, 96, 16, w.zeros, -1, w.mins, uneven)
    kernel = select_cpu_kernel(w, torch.float32)
    assert kernel.name == "cpu-dequant-gather"
    x = torch.randn(4, 96)
    close(kernel(x), quant_linear_reference(x, w), 1e-6)
