"""The advisor prices the weight path the engine takes (describe_model's), not dense weights. The issue's
run: SmolLM2's Q4_1 GGUF ran packed on the CPU in float32, 4.5x slower than the dense float32 weights
the advisor priced (predicted 11.5-41.2 output tok/s, measured 1.33). Where the engine now runs that
file dense (CPU, float32, memory to spare: engine/quantization/weight_path.py), so must the advisor."""

from __future__ import annotations

import pytest

from prefixflow.engine import describe_model
from prefixflow.pipeline.advisor.advise import advise
from prefixflow.pipeline.advisor.engine_path import from_checkpoint, from_description
from prefixflow.pipeline.job.spec import load_job
from tests.pipeline.advisor.support import unique_texts, write_rows

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture
def folder(tmp_path) -> str:
    return write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(12))])


def _advice(folder: str, model: str, gpu: str = "cpu", **engine):
    job = {"task": "summarize", "id_column": "id", "sampling": {"max_tokens": 32}, "engine": engine}
    return advise(load_job(folder, "", model, job), gpu=gpu, sample_size=12)


@pytest.mark.slow  # three advisor runs beside describe_model; the torch-free rules test below is the fast one
@pytest.mark.parametrize("quantization", [None, "gguf", "none"])
def test_the_priced_path_is_the_one_describe_model_reports(folder, quantization) -> None:
    advice = _advice(
        folder, SMOLLM2, dtype="float32", **({"quantization": quantization} if quantization else {})
    )
    described = describe_model(SMOLLM2, dtype="float32", device="cpu", quantization=quantization)
    path = advice.model["engine_path"]
    packed = (
        described["weight_path"]["path"] == "packed"  # float32 dense+packed is priced dense
        if "weight_path" in described
        else bool(described["quantization"].get("packed"))
    )
    assert (path["precision"] is not None) == packed and path["source"] == "describe_model"
    assert advice.estimates[0].precision == ("int4" if packed else "fp32")


def test_a_packed_gguf_on_the_cpu_is_priced_slower_than_dense_float32(folder) -> None:
    packed = _advice(folder, SMOLLM2, dtype="float32", quantization="gguf").estimates[0]  # Q4_1 kept packed
    dense = _advice(folder, SMOLLM2, dtype="float32", quantization="none").estimates[0]
    assert packed.device == dense.device == "cpu"
    assert packed.precision == "int4" and dense.precision == "fp32"
    assert "Q4_1" in packed.efficiency_source and "slowdown" in packed.efficiency_source
    # fewer bytes to read (a bound no slower: on a CPU whose copy rate outruns its float32 matmuls, as on
    # AVX-512 hosts, both are compute-bound and equal), but a slower expected run: the packed kernels
    assert packed.memory_s < dense.memory_s and packed.lower_bound_s <= dense.lower_bound_s
    assert (
        packed.expected_s[0] > dense.expected_s[0] * 1.5 and packed.expected_s[1] > dense.expected_s[1] * 1.5
    )


def test_on_a_gpu_the_packed_bytes_set_the_bound(folder) -> None:
    packed = _advice(folder, SMOLLM2, gpu="h100").estimates[0]
    dense = _advice(folder, SMOLLM2, gpu="h100", quantization="none").estimates[0]
    assert packed.precision == "int4" and dense.precision == "bf16"
    assert packed.lower_bound_s < dense.lower_bound_s


def test_float32_dense_plus_packed_is_priced_dense_and_bf16_as_before() -> None:
    quant = {"method": "gguf", "packed": ["Q4_1"], "dequantized": []}
    both = {"path": "dense+packed", "reason": ""}
    f32 = from_description({"dtype": "float32", "quantization": quant, "weight_path": both})
    assert f32.precision is None and "blocks for decodes" in f32.label
    bf16 = from_description({"dtype": "bfloat16", "quantization": quant, "weight_path": both})
    assert bf16.precision == "int4"


def test_the_torch_free_rules_agree_with_describe_model() -> None:
    gguf = describe_model(SMOLLM2, dtype="bfloat16", device="cuda")
    assert from_description(gguf).precision == from_checkpoint("gguf-Q4_1", None).precision == "int4"
    assert (
        from_checkpoint("gguf-Q4_1", None, on_cpu_float32=True, dense_bytes=1, memory_bytes=8).precision
        is None
    )
    assert (
        from_checkpoint("gguf-Q4_1", None, on_cpu_float32=True, dense_bytes=2, memory_bytes=8).precision
        == "int4"
    )
    assert (
        from_checkpoint("gguf-Q4_1", "none").precision is None
        and from_checkpoint("gguf-F16", None).precision is None
    )
    assert (
        from_checkpoint("gptq-int4", None).method == "gptq"
        and from_checkpoint("awq-int4", None).precision == "int4"
    )
    assert (
        from_checkpoint("bfloat16", "fp8").precision == "fp8"
        and from_checkpoint("bfloat16", None).precision is None
    )
    online = describe_model("tiny", dtype="float32", device="cpu", quantization="int4")
    assert from_description(online).precision == from_checkpoint("float32", "int4").precision == "int4"
