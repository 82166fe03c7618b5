"""Prefix cache + prefix ordering: same greedy tokens in every configuration, shared prefixes
computed once, and results still come back in input order."""

from __future__ import annotations

import random

import pytest

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import hf_greedy

PARAMS = SamplingParams(max_tokens=5, ignore_eos=True)


def shared_prefix_prompts(seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    prefixes = [[rng.randrange(3, 500) for _ in range(rng.randrange(20, 50))] for _ in range(3)]
    rows = [
        p + [rng.randrange(3, 500) for _ in range(rng.randrange(1, 12))] for p in prefixes for _ in range(4)
    ]
    rows.append([rng.randrange(3, 500) for _ in range(30)])  # one unique prompt
    rng.shuffle(rows)
    return rows


def distinct_trie_tokens(rows: list[list[int]]) -> int:
    return len({tuple(r[: i + 1]) for r in rows for i in range(len(r))})


@pytest.fixture(scope="module")
def rows():
    return shared_prefix_prompts()


@pytest.fixture(scope="module")
def reference(llama_dir, rows):
    return hf_greedy(llama_dir, rows, PARAMS.max_tokens)


@pytest.mark.parametrize(
    "options",
    [
        dict(ordering="prefix"),
        dict(ordering="fifo"),
        dict(enable_prefix_caching=False),
        dict(ordering="prefix", num_kv_blocks=14),  # far below the working set: eviction under pressure
        dict(ordering="fifo", num_kv_blocks=14, max_num_batched_tokens=24),
    ],
    ids=["prefix", "fifo", "no-cache", "prefix-small-pool", "fifo-small-pool-chunked"],
)
def test_greedy_tokens_identical_in_every_configuration(llama_dir, rows, reference, options):
    llm = LLM(str(llama_dir), dtype="float32", device="cpu", block_size=8, **options)
    outs = llm.generate(rows, PARAMS)
    assert [o.index for o in outs] == list(range(len(rows)))
    assert [list(o.token_ids) for o in outs] == reference
    stats = llm.stats()
    assert stats.prompt_tokens == sum(map(len, rows))
    if "num_kv_blocks" in options:
        assert llm.engine.kv.pool.evictions > 0  # the pool really was too small for the working set
    if options.get("enable_prefix_caching", True) and "num_kv_blocks" not in options:
        assert stats.cached_prompt_tokens > 0
        assert sum(o.num_cached_tokens for o in outs) == stats.cached_prompt_tokens


def test_prefix_ordering_computes_each_shared_prefix_once(llama_dir):
    rng = random.Random(1)
    prefixes = [[rng.randrange(3, 500) for _ in range(64)] for _ in range(4)]  # whole blocks of 16
    rows = [p + [rng.randrange(3, 500) for _ in range(16)] for p in prefixes for _ in range(8)]
    rng.shuffle(rows)
    llm = LLM(str(llama_dir), dtype="float32", device="cpu", max_num_batched_tokens=4096)
    llm.generate(rows, SamplingParams(max_tokens=1))
    stats = llm.stats()
    # with the budget large enough to admit everything in one step, only holding back requests
    # whose prefix is in flight keeps this at the trie size
    assert stats.computed_prompt_tokens <= 1.05 * distinct_trie_tokens(rows)
    no_cache = LLM(str(llama_dir), dtype="float32", device="cpu", enable_prefix_caching=False)
    no_cache.generate(rows, SamplingParams(max_tokens=1))
    assert no_cache.stats().computed_prompt_tokens == sum(map(len, rows))


def test_prefix_ordering_beats_fifo_when_the_pool_is_small(llama_dir):
    rng = random.Random(2)
    prefixes = [[rng.randrange(3, 500) for _ in range(48)] for _ in range(6)]
    rows = [p + [rng.randrange(3, 500) for _ in range(8)] for p in prefixes for _ in range(6)]
    rng.shuffle(rows)
    computed = {}
    for ordering in ("prefix", "fifo"):
        llm = LLM(
            str(llama_dir),
            dtype="float32",
            device="cpu",
            block_size=8,
            num_kv_blocks=24,
            max_num_seqs=4,
            ordering=ordering,
        )
        llm.generate(rows, SamplingParams(max_tokens=2, ignore_eos=True))
        computed[ordering] = llm.stats().computed_prompt_tokens
    assert computed["prefix"] < computed["fifo"]
    assert computed["prefix"] <= 1.2 * distinct_trie_tokens(rows)
