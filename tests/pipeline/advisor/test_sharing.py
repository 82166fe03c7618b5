"""Trie figures of the sharing analysis, checked against brute force on small random prompt sets."""

from __future__ import annotations

import random

from prefixflow.pipeline.advisor.sharing import analyze, block_cache_min_tokens, distinct_prefix_tokens


def _prompts(seed: int, n: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    heads = [[rng.randrange(50) for _ in range(rng.randint(0, 40))] for _ in range(4)]
    return [rng.choice(heads) + [rng.randrange(50) for _ in range(rng.randint(1, 30))] for _ in range(n)]


def _brute_trie(prompts: list[list[int]]) -> int:
    return len({tuple(p[:i]) for p in prompts for i in range(1, len(p) + 1)})


def test_counts_match_brute_force() -> None:
    for seed in range(5):
        prompts = _prompts(seed)
        s = analyze(prompts, list(range(len(prompts))), 4)
        assert s.distinct_tokens == distinct_prefix_tokens(prompts) == _brute_trie(prompts)
        assert s.block_min_tokens == block_cache_min_tokens(prompts, 4)
        assert s.prompt_tokens == sum(map(len, prompts))
        assert sum(s.cached_tokens) == s.prompt_tokens - s.block_min_tokens


def test_label_suffixes_count_like_the_materialized_requests() -> None:
    suffixes = [[7, 1], [7, 2, 2], [9], [7, 1, 5]]
    for seed in range(5):
        prompts = [p for p in {tuple(p): p for p in _prompts(seed)}.values()]  # distinct prompts
        s = analyze(prompts, list(range(len(prompts))), 4, suffixes=suffixes)
        full = [p + x for p in prompts for x in suffixes]
        m = analyze(full, [i // len(suffixes) for i in range(len(full))], 4)
        assert (s.requests, s.prompt_tokens, s.distinct_tokens, s.block_min_tokens) == (
            m.requests,
            m.prompt_tokens,
            m.distinct_tokens,
            m.block_min_tokens,
        )
        assert s.cached_tokens == m.cached_tokens  # same request order: prompt by prompt, suffixes in order


def test_heads_count_rows_not_requests() -> None:
    head = list(range(100, 140))
    prompts = [head + [i, i] for i in range(10)] + [[1, 2, 3]]
    s = analyze(prompts, [i // 2 for i in range(11)], 8, decode=lambda ids: f"{len(ids)} tokens")
    assert s.heads[0].tokens == 40 and s.heads[0].rows == 5 and s.heads[0].prompts == 10
    assert s.heads[0].preview == "40 tokens"
    assert s.cache_blocks_needed == 5
