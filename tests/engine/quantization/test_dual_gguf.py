"""A GGUF block layer kept both ways (engine/quantization/dual_gguf.py): products of at most
``PACKED_MAX_ROWS`` rows give the packed method's bits, longer ones the dense method's, and the
engine, ``describe_model`` and the footprint agree on the path and the bytes it holds."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as Q
from gguf import quants

from prefixflow.engine import LLM, SamplingParams, describe_model
from prefixflow.engine.models.linear import INVARIANT_MIN_ROWS, Linear
from prefixflow.engine.quantization.dual_gguf import FLOAT32_PACKED_MAX_ROWS, PACKED_MAX_ROWS, DualGGUFMethod
from prefixflow.engine.quantization.gguf_blocks import GGUFMethod, packed_param
from prefixflow.engine.quantization.method import DenseMethod, KernelContext
from prefixflow.engine.quantization.report import linear_kernels
from prefixflow.engine.quantization.weight_path import native_bf16
from prefixflow.kernels import cpu_gguf_matvec

pytestmark = pytest.mark.usefixtures("private_cache")


def _layer(method, blocks: torch.Tensor, out: int, inp: int, dtype: torch.dtype = torch.bfloat16) -> Linear:
    """A CPU layer of ``method`` loaded from Q4_1 ``blocks`` (the dense method dequantizes them)."""
    layer = Linear(inp, out, dtype=dtype, method=method, prefixes=["model.layers.0.mlp.down_proj"])
    name = packed_param("Q4_1")
    layer.load(name, blocks, 0)
    layer.process_after_loading(KernelContext(torch.device("cpu"), dtype))
    return layer


def test_few_rows_take_the_packed_bits_and_more_rows_the_dense_bits():
    out, inp = 96, 128
    data = np.random.default_rng(0).standard_normal((out, inp)).astype(np.float32)
    raw = torch.from_numpy(quants.quantize(data, Q.Q4_1).reshape(out, inp // 32, -1).copy())
    dual = _layer(DualGGUFMethod("Q4_1"), raw, out, inp)
    packed = _layer(GGUFMethod("Q4_1"), raw, out, inp)
    dense = _layer(DenseMethod(), raw, out, inp)
    assert dual.method.name == "gguf-q4_1+dense"
    for rows in (1, PACKED_MAX_ROWS, PACKED_MAX_ROWS + 1, 16, 40):
        x = torch.randn(rows, inp).to(torch.bfloat16)
        want = packed(x) if rows <= PACKED_MAX_ROWS else dense(x)
        assert torch.equal(dual(x), want), rows
    x = torch.randn(1, inp).to(torch.bfloat16)
    assert not torch.equal(packed(x), dense(x))  # the two paths differ, so the checks above can fail


@pytest.mark.skipif(not cpu_gguf_matvec.available(), reason="the native matvec needs a C compiler and AVX2")
def test_float32_few_rows_take_the_native_matvec_of_the_file_blocks():
    out, inp = 96, 128
    data = np.random.default_rng(1).standard_normal((out, inp)).astype(np.float32)
    raw = torch.from_numpy(quants.quantize(data, Q.Q4_1).reshape(out, inp // 32, -1).copy())
    dual = _layer(DualGGUFMethod("Q4_1"), raw, out, inp, torch.float32)
    dense = _layer(DenseMethod(), raw, out, inp, torch.float32)
    assert dual.method.kernel_name == "native-matvec" and torch.equal(dual.gguf_blocks, raw)
    assert not hasattr(dual, "kernel_qweight")  # no torch pack op built: its float32 path is slow
    for rows in (1, FLOAT32_PACKED_MAX_ROWS, FLOAT32_PACKED_MAX_ROWS + 1, 40):
        x = torch.randn(rows, inp)
        want = cpu_gguf_matvec.matvec("Q4_1", raw, x) if rows <= FLOAT32_PACKED_MAX_ROWS else dense(x)
        assert torch.equal(dual(x), want), rows
        assert torch.allclose(dual(x), dense(x), rtol=0, atol=1e-4)
    x = torch.randn(1, inp)
    assert not torch.equal(dual(x), dense(x))  # other sums: the check above can tell the paths apart
    dual.min_rows = dense.min_rows = INVARIANT_MIN_ROWS  # batch-invariant mode: the dense copy only
    x = torch.randn(FLOAT32_PACKED_MAX_ROWS + 4, inp)
    assert torch.equal(dual(x[:1]), dense(x[:1])) and torch.equal(dual(x)[:1], dual(x[:1]))


@pytest.mark.skipif(not native_bf16(), reason="dense+packed is the bf16 path of a CPU with native bf16")
def test_the_engine_and_describe_model_agree_on_dense_plus_packed(q4_file):
    described = describe_model(str(q4_file), device="cpu")
    assert described["weight_path"]["path"] == "dense+packed"
    llm = LLM(str(q4_file), device="cpu", num_kv_blocks=16)
    assert llm.model_identity == described
    assert all(name.startswith("gguf-q4_1+dense/") for name in linear_kernels(llm.engine.runner.shard.model))
    # the packed kernels' own layout differs from the file's blocks by a few scale bytes
    assert abs(llm.stats().weight_bytes - described["weight_bytes"]) < 0.01 * described["weight_bytes"]
    dense = LLM(str(q4_file), device="cpu", num_kv_blocks=16, dtype="bfloat16", quantization="none")
    assert llm.stats().weight_bytes > dense.stats().weight_bytes
    prompts = [list(range(30, 60))] * (PACKED_MAX_ROWS + 2)  # every decode step's products on the dense copy
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    assert [o.token_ids for o in llm.generate(prompts, params)] == [
        o.token_ids for o in dense.generate(prompts, params)
    ]
