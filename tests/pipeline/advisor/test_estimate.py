"""The time estimate's lower bound is the roofline model's, and the model's new terms (prefix-cache hits,
sample scale, sequence limit) hold on hand-computable cases."""

from __future__ import annotations

import pytest

from benchmarks import roofline
from prefixflow.engine import inspect_model
from prefixflow.pipeline.advisor.advise import advise
from prefixflow.pipeline.job.spec import load_job
from tests.pipeline.advisor.support import unique_texts, write_rows

LLAMA_8B = {
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
}


def test_estimate_lower_bound_is_the_roofline_bound_of_the_same_workload(tmp_path) -> None:
    texts = unique_texts(40)
    folder = write_rows(tmp_path / "in", [{"prompt": t} for t in texts])
    job = {"task": "generate", "prompt_column": "prompt", "chat": "off", "sampling": {"max_tokens": 32}}
    advice = advise(load_job(folder, "", "llama-3.2-1b", job), gpu="h200")
    tok = inspect_model("llama-3.2-1b").tokenizer
    lengths = [len(tok.encode(t, add_special_tokens=True)) for t in texts]
    workload = [(n, 32) for n in lengths]  # every row unique from its first character: no cache hits
    assert advice.sharing.block_min_tokens == sum(lengths)
    shape = roofline.load_shape("llama-3.2-1b")
    h200 = roofline.Ceilings(bytes_per_s=4.8e12, flops_per_s=989e12, device="h200", dtype="bf16")
    expected = roofline.lower_bound_seconds(shape, workload, h200, 2.0, 2, 4096, 256)
    est = next(e for e in advice.estimates if e.device == "h200")
    assert est.precision == "bf16" and est.devices_per_lane == 1
    assert est.lower_bound_s == pytest.approx(expected, rel=1e-12)
    assert est.gpu_hours_lower == pytest.approx(expected / 3600)
    lo, hi = est.expected_s
    assert lo == pytest.approx(expected / 0.60) and hi == pytest.approx(expected / 0.25)


def test_the_sample_scale_projects_like_repeating_the_workload() -> None:
    shape = roofline.ModelShape.from_config(LLAMA_8B)
    work = [(300, 20, 0), (500, 40, 256), (120, 5, 64)]
    scaled = roofline.job_cost(shape, work, max_tokens_per_step=512, max_seqs_per_step=2, scale=1000)
    repeated = roofline.job_cost(shape, work * 1000, max_tokens_per_step=512, max_seqs_per_step=2)
    assert scaled == repeated


def test_cached_prompt_tokens_are_not_computed() -> None:
    shape = roofline.ModelShape.from_config(LLAMA_8B)
    plain = roofline.job_cost(shape, [(48, 1)])
    cached = roofline.job_cost(shape, [(48, 1, 32)])
    assert plain.computed_tokens == 48 and cached.computed_tokens == 16
    layer = shape.num_layers * shape.layer_matmul_params
    # 32 fewer tokens through the decoder and 32 fewer K/V writes; attention only for positions 32..47
    assert plain.flops - cached.flops == 2 * layer * 32 + shape.attention_flops(sum(range(1, 33)))
    assert plain.kv_write_bytes - cached.kv_write_bytes == 32 * 128 * 1024


def test_sequence_limit_raises_the_step_count() -> None:
    shape = roofline.ModelShape.from_config(LLAMA_8B)
    work = [(10, 100)] * 64
    assert roofline.job_cost(shape, work).steps == 100
    assert roofline.job_cost(shape, work, max_seqs_per_step=16).steps == 64 * 100 // 16


def test_bad_cached_counts_are_refused() -> None:
    shape = roofline.ModelShape.from_config(LLAMA_8B)
    with pytest.raises(ValueError, match="cached < prompt_len"):
        roofline.job_cost(shape, [(10, 1, 10)])
