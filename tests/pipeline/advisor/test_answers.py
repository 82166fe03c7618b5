"""Constructed datasets flip the six answers the way they should (torch-free path, tiny tokenizer)."""

from __future__ import annotations

import os

import pytest

from prefixflow.engine import inspect_model
from prefixflow.pipeline.advisor.advise import advise
from prefixflow.pipeline.job.spec import load_job
from tests.pipeline.advisor.support import instruction, random_prompts, unique_texts, write_rows


def _answer(advice, number: int):
    return next(a for a in advice.answers if a.number == number)


def test_shared_instruction_shares_with_the_right_block_minimum(tmp_path) -> None:
    instr = instruction(300)
    texts = unique_texts(40)
    folder = write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(texts)])
    job = {
        "task": "generate",
        "id_column": "id",
        "chat": "off",
        "template": instr + "\n\n{{ text }}",
        "sampling": {"max_tokens": 8},
    }
    advice = advise(load_job(folder, "", "tiny", job), gpu="h200")

    tok = inspect_model("tiny").tokenizer  # the oracle: the prompts as the engine gets them, tokenized here
    prompts = [tok.encode(instr + "\n\n" + t, add_special_tokens=True) for t in texts]
    shared = len(os.path.commonprefix(prompts))
    assert shared >= 1000, "the instruction must be at least 1,000 tokens long"
    assert len({p[shared] for p in prompts}) == len(prompts), "every row must diverge right after it"
    total = sum(map(len, prompts))
    # the first prompt in prefix order computes everything; each other one reuses shared // 16 full blocks
    assert advice.sharing.prompt_tokens == total
    assert advice.sharing.block_min_tokens == total - (len(prompts) - 1) * (shared // 16) * 16
    assert advice.sharing.distinct_tokens == total - (len(prompts) - 1) * shared
    assert advice.sharing.cache_blocks_needed == shared // 16
    assert advice.sharing.heads[0].tokens == shared and advice.sharing.heads[0].rows == 40
    q2 = _answer(advice, 2)
    assert q2.verdict == "yes" and advice.settings["ordering"] == "prefix"
    assert f"{advice.sharing.block_min_tokens:,}" in " ".join(q2.evidence)


def test_unique_random_prompts_share_nothing(tmp_path) -> None:
    rows = [{"prompt": p} for p in random_prompts(60)]
    folder = write_rows(tmp_path / "in", rows)
    job = {"task": "generate", "prompt_column": "prompt", "chat": "off", "sampling": {"max_tokens": 8}}
    advice = advise(load_job(folder, "", "tiny", job), gpu="h200")
    assert advice.sharing.best_hit_rate < 0.05
    assert _answer(advice, 2).verdict == "no"
    assert advice.settings["ordering"] == "fifo"


def test_variable_max_tokens_make_output_lengths_variable(tmp_path) -> None:
    texts = unique_texts(50)
    rows = [{"text": t, "max_len": 8 * (1 + (i * 7) % 40)} for i, t in enumerate(texts)]
    folder = write_rows(tmp_path / "in", rows)
    base = {"task": "generate", "template": "Describe: {{ text }}", "chat": "off"}
    variable = advise(
        load_job(
            folder,
            "",
            "tiny",
            {**base, "sampling": {"max_tokens": 16}, "sampling_columns": {"max_tokens": "max_len"}},
        ),
        gpu="h200",
    )
    assert _answer(variable, 3).verdict == "yes"
    assert variable.workload.output_cap.max == 320 and variable.workload.output_cap.p50 < 320
    fixed = advise(
        load_job(folder, "", "tiny", {**base, "sampling": {"max_tokens": 16, "ignore_eos": True}}), gpu="h200"
    )
    assert _answer(fixed, 3).verdict == "no"
    eos = advise(load_job(folder, "", "tiny", {**base, "sampling": {"max_tokens": 16}}), gpu="h200")
    assert _answer(eos, 3).verdict == "likely" and "--pilot" in _answer(eos, 3).recommendation


@pytest.fixture
def review_folder(tmp_path) -> str:
    return write_rows(tmp_path / "in", [{"id": f"r{i}", "text": t} for i, t in enumerate(unique_texts(30))])


def test_llama_8b_on_l4_needs_quantization_or_tp(review_folder) -> None:
    job = {"task": "summarize", "id_column": "id", "sampling": {"max_tokens": 64}}
    advice = advise(load_job(review_folder, "", "llama-3.1-8b", job), gpu="l4")
    q1 = _answer(advice, 1)
    assert q1.verdict == "no"
    assert "quantize" in q1.recommendation and "tensor parallel" in q1.recommendation
    assert advice.settings["quantization"] == "fp8"  # L4 has fp8 math
    from prefixflow.pipeline.advisor.report import engine_settings

    assert engine_settings(advice)["quantization"] == "fp8"  # a valid EngineConfig setting
    from prefixflow.engine import EngineConfig

    EngineConfig(**engine_settings(advice))
    assert advice.fits["bf16"].weight_share > 0.6 and not advice.fits["bf16"].headroom
    l4 = advice.estimates[0]
    assert l4.device == "l4" and l4.precision == "fp8"


def test_tiny_model_on_h200_fits(review_folder) -> None:
    advice = advise(
        load_job(review_folder, "", "tiny", {"task": "summarize", "sampling": {"max_tokens": 16}}), gpu="h200"
    )
    q1 = _answer(advice, 1)
    assert q1.verdict == "yes" and advice.settings["quantization"] is None
    assert advice.settings["tensor_parallel_size"] == 1


def test_label_scoring_has_no_decode(review_folder) -> None:
    job = {
        "task": "label",
        "id_column": "id",
        "template": "Sentiment of: {{ text }}",
        "label": {"labels": ["positive", "negative"]},
    }
    advice = advise(load_job(review_folder, "", "tiny", job), gpu="h200")
    assert advice.workload.output_source == "scoring"
    assert len(advice.workload.requests) == 2 * 30  # one request per label
    assert _answer(advice, 3).verdict == "no"
    assert _answer(advice, 5).verdict == "not applicable"
    assert _answer(advice, 6).verdict == "no"


def test_the_jobs_own_tensor_parallel_group_is_the_target(review_folder) -> None:
    job = {
        "task": "summarize",
        "id_column": "id",
        "sampling": {"max_tokens": 64},
        "engine": {"tensor_parallel_size": 2},
    }
    advice = advise(load_job(review_folder, "", "llama-3.1-8b", job), gpu="l4")
    assert advice.device.name == "l4 x2" and advice.device.memory_bytes == 48 * 10**9
    assert _answer(advice, 1).verdict == "yes" and advice.settings["tensor_parallel_size"] == 2
    est = advice.estimates[0]
    assert est.device == "l4 x2" and est.devices_per_lane == 2
    assert est.gpu_hours_lower == pytest.approx(est.lower_bound_s * 2 / 3600)


def _shaped_model(root, name: str, **shape) -> str:
    """A model directory with a large architecture's config.json and the tiny preset's tokenizer and
    (mismatched, never loaded) weights: the advisor reads only the config and the tokenizer."""
    import json
    import shutil

    from prefixflow.engine.loading.presets import materialize

    target = root / name
    shutil.copytree(materialize("tiny"), target)
    cfg = json.loads((target / "config.json").read_text())
    cfg.update(
        vocab_size=128256, num_key_value_heads=8, head_dim=128, max_position_embeddings=131072, **shape
    )
    (target / "config.json").write_text(json.dumps(cfg))
    return str(target)


LLAMA_70B = dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64)
TOO_BIG = dict(hidden_size=16384, intermediate_size=53248, num_hidden_layers=252, num_attention_heads=128)


@pytest.mark.parametrize(
    "model, gpu",
    [
        ("tiny", "h200"),
        ("tiny", "cpu"),
        ("llama-3.1-8b", "l4"),
        ("llama-3.1-8b", "cpu"),
        ("70b", "l4"),
        ("70b", "h100"),
        ("70b", "a100-80g"),
        ("70b", "cpu"),
    ],
)
def test_recommended_settings_are_ones_the_engine_accepts(tmp_path, review_folder, model, gpu) -> None:
    """Today's main recommended max_num_seqs 1 and max_model_len 0 for a 70B shape on L4 (TP=8): it sized
    the batch from one L4 instead of the group of eight, and EngineConfig refuses max_model_len 0."""
    from prefixflow.engine import EngineConfig
    from prefixflow.pipeline.advisor.report import engine_settings

    path = _shaped_model(tmp_path, "llama-70b", **LLAMA_70B) if model == "70b" else model
    job = {"task": "summarize", "id_column": "id", "sampling": {"max_tokens": 64}}
    advice = advise(load_job(review_folder, "", path, job), gpu=gpu)
    settings = engine_settings(advice)
    EngineConfig(**settings)  # raises on any value the engine refuses
    assert settings["max_model_len"] >= 64 and settings["max_num_seqs"] >= 1
    if model == "70b" and gpu == "l4":  # eight L4s (as pipeline stages over PCIe), sized as a group of eight
        group = settings.get("tensor_parallel_size", 1) * settings.get("pipeline_parallel_size", 1)
        assert group == 8 and settings["max_num_seqs"] > 1


def test_when_nothing_fits_the_advisor_says_so_and_recommends_nothing(tmp_path, review_folder) -> None:
    import io

    from rich.console import Console

    from prefixflow.pipeline.advisor.report import engine_settings, print_advice

    path = _shaped_model(tmp_path, "too-big", **TOO_BIG)  # ~1.6 TB of bf16 weights: more than 64 L4s hold
    job = {"task": "summarize", "id_column": "id", "sampling": {"max_tokens": 64}}
    advice = advise(load_job(review_folder, "", path, job), gpu="l4")
    q1 = _answer(advice, 1)
    assert q1.verdict == "no" and q1.recommendation.startswith("nothing fits")
    assert engine_settings(advice) == {}
    assert _answer(advice, 4).verdict == "not applicable"
    out = io.StringIO()
    print_advice(Console(file=out, width=200), advice)
    assert "none: nothing fits" in out.getvalue() and "max_model_len: 0" not in out.getvalue()


def test_on_pcie_question_1_recommends_pipeline_over_tensor_parallelism(review_folder) -> None:
    """L4s talk over PCIe: the GPUs a model needs become pipeline stages, and the evidence says why."""
    job = {
        "task": "summarize",
        "id_column": "id",
        "sampling": {"max_tokens": 64},
        "engine": {"tensor_parallel_size": 2},
    }
    advice = advise(load_job(review_folder, "", "llama-3.1-8b", job), gpu="l4")
    q1 = _answer(advice, 1)
    assert "pipeline_parallel_size=2 moves far fewer bytes" in q1.recommendation
    traffic = next(e for e in q1.evidence if "over PCIe, per token" in e)
    # Llama-3.1-8B bf16: TP all-reduces 2 x 32 layers x 8 KiB (x 2 (n-1)/n), a pipeline 2 x 8 KiB once
    assert (
        "tensor parallelism sends 512 KiB per GPU" in traffic and "a pipeline 8.0 KiB (64x less)" in traffic
    )
    alone = advise(load_job(review_folder, "", "llama-3.1-8b", {**job, "engine": {}}), gpu="l4")
    assert (
        "or shard bf16 weights over more GPUs (pipeline parallelism: PCIe" in _answer(alone, 1).recommendation
    )
    nvlink = advise(load_job(review_folder, "", "llama-3.1-8b", {**job, "engine": {}}), gpu="h100")
    assert "pipeline" not in _answer(nvlink, 1).recommendation
