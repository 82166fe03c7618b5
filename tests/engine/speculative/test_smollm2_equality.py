"""Greedy speculation on the embedded SmolLM2-135M-Instruct (real weights, real GGUF tokenizer): the
tokens are those of speculation off, for free text (summaries that quote the review) and for JSON
under a schema (with grammar-forced drafts), at batch 1 and 3; the lookup's drafts are both accepted
and rejected."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from prefixflow.engine import LLM, SamplingParams, StructuredOutputs

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[3]

NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "mixed"]},
        "product": {"type": "string", "maxLength": 40},
        "issues": {"type": "array", "items": {"type": "string", "maxLength": 60}, "maxItems": 3},
    },
    "required": ["sentiment", "product", "issues"],
    "additionalProperties": False,
}


def reviews(n: int) -> list[str]:
    lines = (ROOT / "pipeline" / "data" / "demo_reviews.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line)["text"] for line in lines[:n]]


def engine_pair(**engine) -> tuple[LLM, LLM]:
    """Speculation off and on, with a small pool (the default one takes seconds to build)."""
    small = dict(kv_cache_memory_bytes=32 << 20, max_num_seqs=8, **engine)
    return LLM("smollm2-135m-instruct", **small), LLM(
        "smollm2-135m-instruct", speculative_config=NGRAM, **small
    )


@pytest.fixture(scope="module")
def engines():
    torch.set_num_threads(1)
    return engine_pair(dtype="float32")  # token equality is exact in float32 (auto may be bf16)


def chat(llm: LLM, text: str) -> str:
    return llm.apply_chat_template([{"role": "user", "content": text}])


def assert_summaries_identical(off: LLM, on: LLM, batch: int) -> None:
    prompts = [chat(off, f"Summarize this review, quoting it: {t}") for t in reviews(batch)]
    greedy = SamplingParams(temperature=0.0, max_tokens=32)
    before = dict(on.stats().speculation.get("ngram", {"accepted": 0, "proposed": 0}))
    a, b = off.generate(prompts, greedy), on.generate(prompts, greedy)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert all(o.finish_reason != "error" for o in b)
    spec = on.stats().speculation["ngram"]
    accepted, proposed = spec["accepted"] - before["accepted"], spec["proposed"] - before["proposed"]
    assert 0 < accepted < proposed  # drafts accepted, and some rejected (rolled back)


@pytest.mark.parametrize("batch", [1, 3])
def test_summaries_identical_with_speculation_on_and_off(engines, batch):
    assert_summaries_identical(*engines, batch)


def test_json_extraction_identical_with_speculation_on_and_off(engines):
    off, on = engines
    prompts = [
        chat(off, f"Extract the sentiment, the product and the problems. Review: {t}") for t in reviews(2)
    ]
    params = SamplingParams(temperature=0.0, max_tokens=64, structured=StructuredOutputs(json_schema=SCHEMA))
    a, b = off.generate(prompts, params), on.generate(prompts, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    assert all(o.finish_reason == "stop" for o in b), [o.text for o in b]
    for o in b:
        assert set(json.loads(o.text)) == {"sentiment", "product", "issues"}
    assert on.stats().speculation["jump_forward"]["accepted"] > 0  # the keys and quotes the grammar forces


def test_bf16_summaries_identical_with_batch_invariant_kernels():
    """bf16 (the default on a CPU with native bf16): with batch_invariant, verification rows attend one by
    one as decode rows do and the linear layers are row-independent, so the tokens are off's exactly."""
    assert_summaries_identical(*engine_pair(dtype="bfloat16", batch_invariant=True), 3)
