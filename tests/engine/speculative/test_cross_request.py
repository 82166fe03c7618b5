"""Cross-request lookup (output_pool.py): drafts from other requests' outputs, verified exactly.

The pool's counts are checked against a pool rebuilt from scratch (so eviction takes out exactly what it
added); the engine's outputs are checked against speculation off, greedy and seeded, with the pool's
drafts asserted to be proposed and accepted."""

from __future__ import annotations

import random

import pytest

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.speculative.config import SpeculativeConfig
from prefixflow.engine.speculative.output_pool import OutputPool
from tests.engine.speculative.helpers import prompts, run

ENGINE = dict(dtype="float32", device="cpu", block_size=4, num_kv_blocks=2048)
GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
CROSS4 = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 4,
    "cross_request": True,
}


def _pool(max_requests: int = 100, min_probability: float = 0.5) -> OutputPool:
    return OutputPool(2, 4, max_requests, min_probability)


def test_the_pool_proposes_the_most_frequent_follower_of_the_longest_suffix() -> None:
    pool = _pool()
    prompt = [900, 901]
    for key, out in enumerate([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4, 6], [7, 2, 3, 9]]):
        pool.extend(key, prompt + out, len(prompt), len(prompt) + len(out))
    assert pool.propose([50, 1, 2, 3], 3) == [4, 6]  # (1,2,3) -> 4 always; (1,2,3,4) -> 6 twice, 5 once
    assert pool.propose([50, 7, 2, 3], 2) == [9]  # the longest suffix (7,2,3) wins over (2,3) -> 4
    assert pool.propose([900, 901], 2) == [1, 2]  # the prompt's tail predicts how outputs begin
    assert pool.propose([5, 5, 5], 4) == []
    strict = _pool(min_probability=0.7)
    for key, out in enumerate([[1, 2, 3, 4, 5], [1, 2, 3, 4, 6], [1, 2, 3, 4, 6]]):
        strict.extend(key, out, 0, len(out))
    assert strict.propose([1, 2, 3], 3) == [4]  # 6 holds 2/3 of (1,2,3,4)'s followers: under 0.7


def test_incremental_indexing_and_eviction_leave_the_counts_of_a_fresh_pool() -> None:
    rng = random.Random(0)
    outputs = {key: [rng.randrange(6) for _ in range(rng.randrange(3, 30))] for key in range(12)}
    prompts_ = {key: [100 + rng.randrange(4) for _ in range(rng.randrange(0, 6))] for key in outputs}
    pool = _pool(max_requests=5)
    for key, out in outputs.items():
        tokens = prompts_[key] + out
        for end in range(len(prompts_[key]), len(tokens) + 1, 3):  # a few tokens per step, as decoded
            pool.extend(key, tokens, len(prompts_[key]), end)
        pool.extend(key, tokens, len(prompts_[key]), len(tokens))
    fresh = _pool(max_requests=5)
    for key in list(outputs)[-5:]:
        tokens = prompts_[key] + outputs[key]
        fresh.extend(key, tokens, len(prompts_[key]), len(tokens))
    assert list(pool.requests) == list(range(7, 12))
    assert pool.counts == fresh.counts and pool.counts


def test_greedy_identical_and_a_second_pass_accepts_the_pool_drafts() -> None:
    items = prompts(7, seed=21)
    off, _, _ = run("tiny", items + items, GREEDY, None, **ENGINE)
    llm = LLM("tiny", speculative_config=CROSS4, **ENGINE)
    first = [o.token_ids for o in llm.generate(items, GREEDY)]
    before = llm.stats().speculation.get("cross_request", {}).get("accepted", 0)
    second = [o.token_ids for o in llm.generate(items, GREEDY)]
    assert first + second == off
    cross = llm.stats().speculation["cross_request"]
    # the same prompts again: the pool has their outputs, so its drafts are right far more often
    assert cross["accepted"] - before > 20
    assert 0 < cross["accepted"] < cross["proposed"]


def test_seeded_sampling_identical_with_the_pool_on_and_off() -> None:
    items = prompts(7, seed=22)
    params = [SamplingParams(temperature=0.8, top_p=0.9, seed=100 + i, max_tokens=32) for i in range(7)]
    off, _, _ = run("tiny", items + items, params + params, None, **ENGINE)
    on, stats, _ = run("tiny", items + items, params + params, CROSS4, **ENGINE)
    assert on == off
    assert stats.speculation["cross_request"]["proposed"] > 0


def test_auto_uses_the_pool_by_default_and_a_fixed_k_does_not() -> None:
    auto = SpeculativeConfig.parse({"method": "ngram"})
    fixed = SpeculativeConfig.parse({"method": "ngram", "num_speculative_tokens": 4})
    assert auto.uses_cross_request and not fixed.uses_cross_request
    assert SpeculativeConfig.parse({"method": "ngram", "cross_request": False}).uses_cross_request is False
    items = prompts(7, seed=23)
    off, _, _ = run("tiny", items + items, GREEDY, None, **ENGINE)
    on, _, llm = run("tiny", items + items, GREEDY, {"method": "ngram"}, **ENGINE)
    assert on == off
    pool = llm.engine.speculator.pool
    assert pool is not None and len(pool.requests) == 14 and pool.counts
    indexed = sorted(tuple(e.tokens[e.first :]) for e in pool.requests.values())
    assert indexed == sorted(on)  # every output whole, its last tokens included
    _, _, fixed_llm = run("tiny", items, GREEDY, {"method": "ngram", "num_speculative_tokens": 4}, **ENGINE)
    assert fixed_llm.engine.speculator.pool is None


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"cross_request": "yes"}, "cross_request"),
        ({"cross_request_requests": 0}, "cross_request_requests"),
        ({"cross_request_min_probability": 0.0}, "cross_request_min_probability"),
        ({"cross_request_min_probability": 1.5}, "cross_request_min_probability"),
        ({"method": "draft_model", "model": "tiny", "cross_request": True}, "cross_request"),
    ],
)
def test_bad_cross_request_options_fail_before_any_work(options: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SpeculativeConfig.parse({"method": "ngram", **options})
