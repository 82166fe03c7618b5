"""Dense linear layers on the CPU take the kernel kernels/cpu_linear.py chooses (oneDNN-prepacked bf16
where the CPU's oneDNN can, else ``F.linear`` on the loaded weight), and ``describe_model``, the loaded
engine's identity and its layers agree on which."""

from __future__ import annotations

import pytest
import torch

from prefixflow.engine import LLM, SamplingParams, describe_model
from prefixflow.engine.models.linear import Linear
from prefixflow.engine.quantization.method import KernelContext
from prefixflow.engine.quantization.report import linear_kernels, weight_bytes
from prefixflow.kernels import cpu_linear

PREPACK_REASON = cpu_linear.prepack_unsupported(torch.bfloat16)


def rand(*shape: int, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) / shape[-1] ** 0.5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_dense_layer_gives_the_reference_through_whichever_kernel_it_took(dtype: torch.dtype) -> None:
    layer = Linear(64, [32, 48], dtype=dtype)
    w = rand(80, 64, seed=4).to(dtype)
    layer.load("weight", w[:32], 0)
    layer.load("weight", w[32:], 1)
    layer.process_after_loading(KernelContext(torch.device("cpu"), dtype))
    x = rand(17, 64, seed=5).to(dtype)
    want = cpu_linear.reference_linear(x, w, None)
    prepacked = dtype == torch.bfloat16 and PREPACK_REASON is None
    assert (layer.method.kernel_name == cpu_linear.PREPACKED) == prepacked  # type: ignore[attr-defined]
    assert hasattr(layer, "weight") != prepacked  # prepacking frees the dense copy
    assert weight_bytes(layer) == w.numel() * w.element_size()  # counted once, either way
    if prepacked:
        torch.testing.assert_close(layer(x).float(), want.float(), rtol=1.6e-2, atol=1e-2)
    else:
        assert torch.equal(layer(x), want)  # the loaded weight through F.linear, bit for bit


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_engine_describe_model_and_loaded_layers_agree_on_the_kernel(dtype: str) -> None:
    described = describe_model("tiny", dtype=dtype, device="cpu")
    llm = LLM("tiny", dtype=dtype, device="cpu", num_kv_blocks=16)
    assert llm.model_identity == described
    kernel = described["linear_kernel"]["kernel"]
    kernels = linear_kernels(llm.engine.runner.shard.model)
    assert set(kernels) == ({"dense/onednn-prepacked"} if kernel == cpu_linear.PREPACKED else {"dense"})
    out = llm.generate(
        [[5, 6, 7, 8]], SamplingParams(max_tokens=4, ignore_eos=True)
    )  # runs through the chosen kernel
    assert len(out[0].token_ids) == 4


def test_a_layer_told_to_prepack_frees_its_dense_weight_and_still_gives_the_reference(monkeypatch) -> None:
    """The wiring of the prepacked path, run on any CPU: float32 is forced onto it (oneDNN prepacks
    float32 everywhere), the real oneDNN op multiplies."""
    from prefixflow.engine.quantization import method

    forced = cpu_linear.LinearKernel(cpu_linear.PREPACKED, "forced by the test")
    monkeypatch.setattr(method, "linear_kernel", lambda device, dtype: forced)
    layer = Linear(64, [32, 48])
    w = rand(80, 64, seed=4)
    layer.load("weight", w[:32], 0)
    layer.load("weight", w[32:], 1)
    layer.process_after_loading(KernelContext(torch.device("cpu"), torch.float32))
    assert layer.method.kernel_name == cpu_linear.PREPACKED and not hasattr(layer, "weight")  # type: ignore[attr-defined]
    assert weight_bytes(layer) == w.numel() * 4 and linear_kernels(layer) == {"dense/onednn-prepacked": 1}
    x = rand(17, 64, seed=5)
    torch.testing.assert_close(layer(x), cpu_linear.reference_linear(x, w, None), rtol=1e-5, atol=1e-5)
