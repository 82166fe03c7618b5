"""Greedy outputs must be token-identical to transformers for every supported architecture,
whatever the batching: mixed lengths, tiny token budgets (chunked prefill), tiny pools (preemption)."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import hf_greedy, random_prompts

MAX_NEW = 10
GREEDY = SamplingParams(max_tokens=MAX_NEW, ignore_eos=True)


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(6, 3, 70, seed=7)


@pytest.fixture(scope="module")
def expected(request, prompts):
    cache: dict = {}

    def get(model_dir):
        if model_dir not in cache:
            cache[model_dir] = hf_greedy(model_dir, prompts, MAX_NEW)
        return cache[model_dir]

    return get


def _engine_tokens(model_dir, prompts, **options) -> list[list[int]]:
    llm = LLM(str(model_dir), dtype="float32", device="cpu", **options)
    outs = llm.generate(prompts, GREEDY)
    assert all(o.finish_reason == "length" for o in outs), [o.error for o in outs]
    return [list(o.token_ids) for o in outs], llm


def test_mixed_batch_matches_transformers(arch_dir, prompts, expected):
    got, _ = _engine_tokens(arch_dir, prompts)
    assert got == expected(arch_dir)


def test_chunked_prefill_matches_transformers(arch_dir, prompts, expected):
    got, llm = _engine_tokens(arch_dir, prompts, max_num_batched_tokens=16, block_size=8)
    assert got == expected(arch_dir)
    assert llm.stats().steps > len(prompts)  # prompts of up to 70 tokens had to be split


def test_preemption_matches_transformers(arch_dir, prompts):
    # 30 blocks of 4 tokens hold one long request alone but not the batch: outputs outgrow the
    # admission reservation (prompt + 4 blocks), so running requests get preempted and recomputed
    llm = LLM(str(arch_dir), dtype="float32", device="cpu", num_kv_blocks=30, block_size=4)
    outs = llm.generate(prompts, SamplingParams(max_tokens=40, ignore_eos=True))
    assert [list(o.token_ids) for o in outs] == hf_greedy(arch_dir, prompts, 40)
    assert llm.stats().preemptions > 0


def test_fifo_and_no_cache_match_transformers(llama_dir, prompts, expected):
    got, _ = _engine_tokens(llama_dir, prompts, ordering="fifo", enable_prefix_caching=False)
    assert got == expected(llama_dir)
