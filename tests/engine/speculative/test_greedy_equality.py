"""Greedy decoding is token-for-token the same with speculation on and off: batch 1, 7 and 64, with
prefix-cache hits, chunked prefill and preemption each asserted to happen, for a fixed k and auto."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams
from tests.engine.speculative.helpers import AUTO_NGRAM, prompts, run

GREEDY = SamplingParams(temperature=0.0, max_tokens=48, ignore_eos=True)
NGRAM4 = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
ENGINE = dict(dtype="float32", device="cpu", block_size=4, num_kv_blocks=2048)  # a small pool: fast to build


@pytest.mark.parametrize("batch", [1, 7, 64])
def test_ngram_greedy_identical_to_spec_off(batch):
    items = prompts(batch, seed=batch)
    off, off_stats, _ = run("tiny", items, GREEDY, None, **ENGINE)
    on, stats, _ = run("tiny", items, GREEDY, NGRAM4, **ENGINE)
    assert on == off
    ngram = stats.speculation["ngram"]
    assert ngram["accepted"] > 0 and ngram["accepted"] < ngram["proposed"]  # accepted and rejected runs
    assert stats.steps <= off_stats.steps
    if batch == 1:
        assert stats.steps < off_stats.steps  # accepted drafts saved steps
    else:
        assert stats.cached_prompt_tokens > 0


def test_identical_under_chunked_prefill_and_preemption():
    items = prompts(24, seed=5)
    tight = dict(ENGINE, num_kv_blocks=40, max_num_batched_tokens=20, max_num_seqs=16)
    off, _, _ = run("tiny", items, GREEDY, None, **ENGINE)
    on, stats, _ = run("tiny", items, GREEDY, NGRAM4, **tight)
    assert on == off
    assert stats.preemptions > 0
    assert stats.speculation["ngram"]["accepted"] > 0
    assert stats.computed_prompt_tokens > sum(len(p) for p in items) - stats.cached_prompt_tokens  # recompute


def test_auto_policy_identical_and_speculates_at_batch_1():
    items = prompts(1, seed=11)
    off, _, _ = run("tiny", items, GREEDY, None, **ENGINE)
    on, stats, _ = run("tiny", items, GREEDY, AUTO_NGRAM, **ENGINE)
    assert on == off
    assert stats.speculation["ngram"]["proposed"] > 0


def test_stop_ids_max_and_min_tokens_inside_accepted_runs():
    items = prompts(7, seed=3)
    params = [
        SamplingParams(temperature=0.0, max_tokens=5 + 3 * i, min_tokens=2 + i, stop_token_ids=[i * 37 % 512])
        for i in range(7)
    ]
    off, _, _ = run("tiny", items, params, None, **ENGINE)
    on, stats, _ = run("tiny", items, params, NGRAM4, **ENGINE)
    assert on == off
    assert stats.speculation["ngram"]["accepted"] > 0


def test_penalties_and_logprobs_per_position():
    items = prompts(7, seed=4)
    params = SamplingParams(
        temperature=0.0,
        max_tokens=32,
        repetition_penalty=1.02,
        frequency_penalty=0.01,
        presence_penalty=0.01,
        logprobs=2,
        ignore_eos=True,
    )
    a = LLM("tiny", **ENGINE).generate(items, params)
    llm_on = LLM("tiny", speculative_config=NGRAM4, **ENGINE)
    b = llm_on.generate(items, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b):
        assert len(y.logprobs) == len(y.token_ids)
        for token, p, q in zip(x.token_ids, x.logprobs, y.logprobs):  # vLLM's shape: {token id: Logprob}
            assert list(p) == list(q) and p[token].logprob == pytest.approx(q[token].logprob, abs=1e-4)
            assert [lp.rank for lp in p.values()] == [lp.rank for lp in q.values()]
    assert llm_on.stats().speculation["ngram"]["accepted"] > 0


def test_processed_logprobs_mode_holds_inside_verified_runs():
    """logprobs_mode='processed' (penalties applied) is the same with speculation on: verified runs sample
    through the same mode, not raw logprobs."""
    items = prompts(7, seed=4)
    params = SamplingParams(
        temperature=0.0, max_tokens=32, repetition_penalty=1.1, logprobs=1, ignore_eos=True
    )
    a = LLM("tiny", logprobs_mode="processed", **ENGINE).generate(items, params)
    llm_on = LLM("tiny", logprobs_mode="processed", speculative_config=NGRAM4, **ENGINE)
    b = llm_on.generate(items, params)
    assert [o.token_ids for o in a] == [o.token_ids for o in b]
    for x, y in zip(a, b):
        for token, p, q in zip(x.token_ids, x.logprobs, y.logprobs):
            assert p[token].logprob == pytest.approx(q[token].logprob, abs=1e-4)
    assert llm_on.stats().speculation["ngram"]["accepted"] > 0


@pytest.mark.parametrize("batch", [1, 7])
def test_bf16_with_batch_invariant_kernels_identical_to_spec_off(batch):
    """In bf16 a verification step's 5 query rows round differently from a 1-row decode unless every row
    attends on its own (batch_invariant): then speculation changes no token in bf16 either."""
    items = prompts(batch, seed=100 + batch)
    bf16 = dict(ENGINE, dtype="bfloat16", batch_invariant=True)
    off, _, _ = run("tiny", items, GREEDY, None, **bf16)
    on, stats, _ = run("tiny", items, GREEDY, NGRAM4, **bf16)
    assert on == off
    ngram = stats.speculation["ngram"]
    assert 0 < ngram["accepted"] < ngram["proposed"]


def test_float32_gguf_blocks_with_batch_invariant_kernels_identical_to_spec_off(q4_file):
    """A float32 GGUF file multiplies products of 1-64 rows on its blocks and larger ones dense, so a
    verification step may round unlike the decodes it replaces; batch_invariant keeps every product
    dense, and then speculation changes no token (docs/engine.md)."""
    from prefixflow.engine.quantization.dual_gguf import FLOAT32_PACKED_MAX_ROWS

    items = prompts(14, seed=8, vocab=200)
    invariant = dict(ENGINE, batch_invariant=True)
    off, _, _ = run(str(q4_file), items, GREEDY, None, **invariant)
    on, stats, _ = run(str(q4_file), items, GREEDY, NGRAM4, **invariant)
    assert on == off
    assert stats.speculation["ngram"]["accepted"] > 0
    crossing = len(items) * (NGRAM4["num_speculative_tokens"] + 1)
    assert crossing > FLOAT32_PACKED_MAX_ROWS  # steps cross the switch
