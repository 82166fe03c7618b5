"""The advisor prices the weight path the engine takes (describe_model's), not dense weights: SmolLM2's
GGUF file runs its Q4_1 blocks packed, which on the CPU in float32 is slower than dense float32 (the
issue's run: predicted 11.5-41.2 output tok/s from dense float32 weights, measured 1.33)."""

from __future__ import annotations

import pytest

from prefixflow.engine import describe_model
from prefixflow.pipeline.advisor.advise import advise
from prefixflow.pipeline.advisor.engine_path import engine_path
from prefixflow.pipeline.spec import load_job
from tests.pipeline.advisor.support import unique_texts, write_rows

SMOLLM2 = "smollm2-135m-instruct"


@pytest.fixture
def folder(tmp_path) -> str:
    return write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(12))])


def _advice(folder: str, model: str, **engine):
    job = {"task": "summarize", "id_column": "id", "sampling": {"max_tokens": 32}, "engine": engine}
    return advise(load_job(folder, "", model, job), gpu="cpu", sample_size=12)


@pytest.mark.slow  # four advisor runs, one parsing the GGUF file; the mapping test below is the fast one
@pytest.mark.parametrize("model, quantization", [(SMOLLM2, None), (SMOLLM2, "none"), ("tiny", None), ("tiny", "int4")])
def test_the_path_is_the_one_describe_model_reports(folder, model, quantization) -> None:
    advice = _advice(folder, model, **({"quantization": quantization} if quantization else {}))
    described = describe_model(model, dtype="float32", device="cpu", quantization=quantization)["quantization"]
    path = advice.model["engine_path"]
    packed = described.get("packed") or ([described["method"]] if described["method"] in ("int4", "int8") else [])
    if described["method"] == "gguf" and not described["packed"]:
        assert path["precision"] is None  # every GGUF block dequantized: dense
    else:
        assert path["method"] == described["method"]
        assert (path["precision"] is not None) == bool(packed)


def test_a_packed_gguf_on_the_cpu_is_priced_slower_than_dense_float32(folder) -> None:
    packed = _advice(folder, SMOLLM2).estimates[0]
    dense = _advice(folder, SMOLLM2, quantization="none").estimates[0]
    assert packed.device == dense.device == "cpu"
    assert packed.precision == "int4" and dense.precision == "fp32"
    assert "Q4_1" in packed.efficiency_source and "slowdown" in packed.efficiency_source
    # fewer bytes to read (a faster bound), but a slower expected run: the packed float32 kernels
    assert packed.lower_bound_s < dense.lower_bound_s
    assert packed.expected_s[0] > dense.expected_s[0] * 1.5 and packed.expected_s[1] > dense.expected_s[1] * 1.5


def test_engine_path_mapping() -> None:
    assert engine_path("gguf-Q4_1", None).precision == "int4"
    assert engine_path("gguf-Q8_0", None).precision == "int8"
    assert engine_path("gguf-F16", None).precision is None  # the engine dequantizes other block types
    assert engine_path("gguf-Q4_1", "none").precision is None
    assert engine_path("gptq-int4", None).method == "gptq" and engine_path("awq-int4", None).precision == "int4"
    assert engine_path("bfloat16", "fp8").precision == "fp8" and engine_path("bfloat16", None).precision is None
