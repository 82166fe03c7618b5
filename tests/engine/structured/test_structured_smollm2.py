"""Structured outputs on the embedded SmolLM2-135M-Instruct (real text, real GGUF tokenizer): the mask
never hides the free greedy choice when that choice is allowed, and a constrained run survives
preemption with identical tokens."""

from __future__ import annotations

import re

import pytest
import torch

from benchmarks.structured_workload import SCHEMAS, extraction_prompts, extraction_rows

pytestmark = pytest.mark.slow

QUESTIONS = [
    "Is the sky blue? Answer yes or no.",
    "Name one primary colour.",
    "What is 2 + 2? Answer with a number.",
    "Give a one-word synonym for happy.",
    "Which is bigger, a cat or a horse?",
    "Say hello in French.",
]


@pytest.fixture(scope="module")
def llm():
    from prefixflow.engine import LLM

    torch.set_num_threads(1)
    return LLM("smollm2-135m-instruct", dtype="float32")  # exact equalities: float32 (auto may be bf16)


def test_constrained_greedy_equals_free_greedy_when_the_free_answer_is_allowed(llm):
    from prefixflow.engine import SamplingParams, StructuredOutputs

    prompts = [llm.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    free = llm.generate(prompts, SamplingParams(max_tokens=16))
    for prompt, out in zip(prompts, free):
        text = out.text
        assert text and "\ufffd" not in text
        for so in (
            StructuredOutputs(choice=[text, text + " Indeed.", "Something else"]),
            StructuredOutputs(regex=re.escape(text) + "|zz+"),
            StructuredOutputs(grammar=r"root ::= [^\x00]*"),
        ):
            got = llm.generate([prompt], SamplingParams(max_tokens=16, structured=so))[0]
            assert got.token_ids == out.token_ids, (so, text, got.text)


def test_preemption_mid_request_gives_identical_constrained_output(llm):
    from prefixflow.engine import LLM, SamplingParams, StructuredOutputs

    rows = extraction_rows(per_review_schema=4)[:8]  # 4 review + 4 rating answers, 33-46 tokens each
    prompts = extraction_prompts(llm, rows)
    max_tokens = 96
    params = [
        SamplingParams(max_tokens=max_tokens, structured=StructuredOutputs(json_schema=SCHEMAS[n]))
        for n, _ in rows
    ]
    expected = llm.generate(prompts, params)
    assert all(o.finish_reason == "stop" for o in expected)
    # A pool of 4-token blocks that holds one request and a bit: admitted requests outgrow their
    # reservation while decoding, so the newest is preempted and recomputed, several times.
    longest = max(len(llm.tokenizer.encode(p)) for p in prompts) + max_tokens
    small = LLM("smollm2-135m-instruct", dtype="float32", num_kv_blocks=-(-longest // 4) + 6, block_size=4)
    assert [o.token_ids for o in small.generate(prompts, params)] == [o.token_ids for o in expected]
    assert small.stats().preemptions > 0
