"""A GGUF file's packed blocks run dense on the CPU in float32 when memory allows (with the blocks kept
for few-row products where the native matvec builds), packed otherwise (issue 24): the rule, what the
engine builds, and that ``describe_model`` reports the same choice."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as Q

from prefixflow.engine import LLM, SamplingParams, describe_model
from prefixflow.engine.quantization import resolve_quantization
from prefixflow.engine.quantization.dual_gguf import FLOAT32_PACKED_MAX_ROWS
from prefixflow.engine.quantization.report import linear_kernels
from prefixflow.engine.quantization.weight_path import (
    MEMORY_SHARE,
    apply_weight_path,
    choose_weight_path,
    cpu_auto_dtype,
    gguf_dense_bytes,
    native_bf16,
)
from prefixflow.kernels import cpu_gguf_matvec
from tests.engine.gguf.test_gguf_loader import tiny_hf_model, write_gguf

GGUF_Q4_1 = {
    "quant_method": "gguf",
    "tensor_types": {
        "model.layers.0.self_attn.q_proj.weight": "Q4_1",
        "model.layers.0.mlp.down_proj.weight": "Q4_1",
        "model.embed_tokens.weight": "Q8_0",
    },
}
MIB = 2**20
pytestmark = pytest.mark.usefixtures("private_cache")


def choose(
    requested=None,
    device="cpu",
    dtype="float32",
    dense=100 * MIB,
    memory=16 * 1024 * MIB,
    native=False,
    matvec=True,
    cpu_int8="auto",
):
    quant = resolve_quantization({"quantization_config": GGUF_Q4_1}, requested)
    return choose_weight_path(quant, requested, device, dtype, dense, memory, native, matvec, cpu_int8)


def test_cpu_float32_runs_dense_when_memory_allows_and_packed_when_it_does_not():
    both = choose()
    assert both is not None and both.path == "dense+packed" and "float32" in both.reason
    assert "native matvec" in both.reason and f"{FLOAT32_PACKED_MAX_ROWS} rows" in both.reason
    assert "Q8_0" not in both.reason  # the embedding is not a packed linear layer
    dense = choose(matvec=False)  # no C compiler: the dense matmul for every product
    assert dense is not None and dense.path == "dense" and "C compiler" in dense.reason
    tight = choose(dense=100 * MIB, memory=100 * MIB * MEMORY_SHARE - 1)
    assert tight is not None and tight.path == "packed" and "memory" in tight.reason


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cpu_int8_on_takes_the_dense_layers_it_quantizes(dtype):
    path = choose(dtype=dtype, native=True, cpu_int8="on")
    assert path is not None and path.path == "dense" and "cpu_int8='on'" in path.reason


def test_bf16_runs_dense_only_where_the_cpu_multiplies_bf16_natively():
    native = choose(dtype="bfloat16", native=True)
    assert native is not None and native.path == "dense+packed" and "natively" in native.reason
    emulated = choose(dtype="bfloat16", native=False)
    assert emulated is not None and emulated.path == "packed" and "without native bf16" in emulated.reason
    assert choose(device="cuda", dtype="bfloat16", native=True).path == "packed"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("kwargs", "why"),
    [
        ({"device": "cuda"}, "cuda"),
        ({"dtype": "bfloat16"}, "bfloat16"),
        ({"requested": "gguf"}, "quantization='gguf'"),
    ],
)
def test_packed_where_it_is_the_faster_or_the_requested_path(kwargs, why):
    path = choose(**kwargs)
    assert path is not None and path.path == "packed" and why in path.reason


def test_other_formats_have_no_path_to_choose():
    assert choose_weight_path(resolve_quantization({}), None, "cpu", "float32", 1, 1 << 40) is None
    none = resolve_quantization({"quantization_config": GGUF_Q4_1}, "none")
    assert choose_weight_path(none, "none", "cpu", "float32", 1, 1 << 40) is None
    assert apply_weight_path(none, None) is none


@pytest.fixture(scope="module")
def engines(q4_file):
    """The file loaded three ways: the default, quantization="none" (dense) and "gguf" (packed)."""
    return {
        q: LLM(str(q4_file), dtype="float32", device="cpu", num_kv_blocks=16, quantization=q)
        for q in (None, "none", "gguf")
    }


@pytest.mark.skipif(not cpu_gguf_matvec.available(), reason="the native matvec needs a C compiler and AVX2")
def test_default_cpu_engine_runs_a_q4_1_file_dense_plus_packed_in_float32(engines):
    default, dense, packed = engines[None], engines["none"], engines["gguf"]
    assert set(linear_kernels(default.engine.runner.shard.model)) == {"gguf-q4_1+dense/native-matvec"}
    assert set(linear_kernels(packed.engine.runner.shard.model)) == {"gguf-q4_1/cpu-dequant"}
    assert default.stats().weight_bytes > dense.stats().weight_bytes > packed.stats().weight_bytes
    prompts = [[5, 60, 70, 80], list(range(30, 75))]
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    ids = [o.token_ids for o in default.generate(prompts, params)]
    assert ids == [o.token_ids for o in dense.generate(prompts, params)]  # the same weights, other sums
    # the dense copy is quantization="none"'s weights bit for bit
    theirs = dict(dense.engine.runner.shard.model.named_modules())
    copies = {
        name: module.dense_weight
        for name, module in default.engine.runner.shard.model.named_modules()
        if hasattr(module, "dense_weight")
    }
    assert copies and all(torch.equal(copy, theirs[name].weight) for name, copy in copies.items())


def test_describe_model_reports_the_path_the_engine_takes(q4_file, engines):
    both = "dense+packed" if cpu_gguf_matvec.available() else "dense"
    for quantization, path in ((None, both), ("gguf", "packed")):
        described = describe_model(str(q4_file), dtype="float32", device="cpu", quantization=quantization)
        assert described["weight_path"]["path"] == path
        assert engines[quantization].model_identity == described
    none = describe_model(str(q4_file), dtype="float32", device="cpu", quantization="none")
    assert "weight_path" not in none  # nothing to choose: dense was asked for
    default = describe_model(str(q4_file), dtype="float32", device="cpu")
    assert default["weight_bytes"] >= none["weight_bytes"]  # the blocks too where they are kept
    int8 = describe_model(str(q4_file), dtype="float32", device="cpu", cpu_int8="on")
    assert int8["weight_path"]["path"] == "dense" and int8["weight_bytes"] == none["weight_bytes"]
    assert gguf_dense_bytes(q4_file, "float32") > 0


def test_auto_dtype_on_the_cpu_is_bf16_only_for_a_block_file_where_bf16_is_native(q4_file, tmp_path):
    assert cpu_auto_dtype(q4_file, native=True) == "bfloat16"
    assert cpu_auto_dtype(q4_file, native=False) == "float32"
    assert cpu_auto_dtype(None, native=True) == "float32"  # an HF directory, a preset, an in-memory model
    f32_file = write_gguf(tmp_path / "tiny-f32.gguf", tiny_hf_model(), qtype=Q.F32)
    assert cpu_auto_dtype(f32_file, native=True) == "float32"  # no blocks: float32 weights keep float32


def test_auto_dtype_engine_and_describe_model_agree_on_this_host(q4_file):
    want = "bfloat16" if native_bf16() else "float32"
    described = describe_model(str(q4_file), device="cpu")
    assert described["dtype"] == want
    llm = LLM(str(q4_file), device="cpu", num_kv_blocks=16)
    assert llm.model_identity == described and llm.engine.runner.shard.dtype == getattr(torch, want)
    float32 = describe_model(str(q4_file), dtype="float32", device="cpu")
    assert (float32["digest"] == described["digest"]) == (
        want == "float32"
    )  # the fingerprint holds the resolved dtype
