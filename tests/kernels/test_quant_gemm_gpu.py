"""Real-shape checks of the quantized linear kernels on a CUDA GPU (bf16 activations).

Skipped without CUDA; run by benchmarks/gpu_check.sh.
"""

from __future__ import annotations

import pytest
import torch

from prefixflow.kernels.quant_weight import PackedWeight, pack_along_rows, quant_linear_reference

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")


def _int4(k: int, n: int, group: int, act_order: bool) -> PackedWeight:
    gen = torch.Generator(device=CUDA).manual_seed(k + n)
    q = torch.randint(0, 16, (k, n), device=CUDA, generator=gen)
    groups = -(-k // group)
    scales = (torch.rand(groups, n, device=CUDA, generator=gen) * 0.01 + 1e-3).half()
    zeros = torch.randint(0, 16, (groups, n), device=CUDA, generator=gen).half()
    g_idx = None
    if act_order:
        perm = torch.randperm(k, device=CUDA, generator=gen)
        g_idx = torch.empty(k, dtype=torch.int32, device=CUDA)
        g_idx[perm] = (torch.arange(k, device=CUDA) // group).int()
    return PackedWeight(pack_along_rows(q, 4), scales, 4, k, group, zeros, -1, None, g_idx)


@pytest.mark.parametrize("m", [1, 16, 256])
@pytest.mark.parametrize("act_order", [False, True])
def test_w4a16_8b_shapes(m: int, act_order: bool) -> None:
    from prefixflow.kernels.triton_quant_gemm import quant_linear

    for k, n in [(4096, 6144), (14336, 4096)]:
        w = _int4(k, n, 128, act_order)
        x = torch.randn(m, k, device=CUDA, dtype=torch.bfloat16)
        got, want = quant_linear(x, w).float(), quant_linear_reference(x.float(), w)
        assert (got - want).abs().max() <= 2e-2 * want.abs().max()


def test_fp8_scaled_mm_matches_the_reference() -> None:
    from prefixflow.engine.quantization.online import quantize_fp8
    from prefixflow.kernels.fp8_linear import (
        Fp8Weight,
        fp8_linear_reference,
        fp8_linear_scaled_mm,
        scaled_mm_supported,
    )

    q, s = quantize_fp8(torch.randn(4096, 4096, device=CUDA) * 0.02)
    w = Fp8Weight(q, s)
    if not scaled_mm_supported(w, CUDA):
        pytest.skip("torch._scaled_mm needs compute capability >= 8.9")
    x = torch.randn(300, 4096, device=CUDA, dtype=torch.bfloat16)
    got, want = fp8_linear_scaled_mm(x, w).float(), fp8_linear_reference(x, w).float()
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()


def test_quantized_engine_runs_on_cuda(tmp_path) -> None:
    from prefixflow.engine import LLM, SamplingParams
    from prefixflow.engine.quantization.report import linear_kernels

    for kind, kernel in (("int4", "triton-w4a16"), ("int8", "triton-w8a16"), ("fp8", "fp8-scaled-mm")):
        llm = LLM("tiny", device="cuda", quantization=kind)
        assert all(
            name.endswith(kernel) or name == "dense" for name in linear_kernels(llm.engine.runner.shard.model)
        )
        out = llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=4, ignore_eos=True))
        assert out[0].finish_reason == "length"
