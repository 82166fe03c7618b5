"""Shared-prefix workloads (token-id prompts) and the exact size of their prefix trie (issue 4).

- labeling: every instruction prefix applied to every document, rows shuffled (a labeling job);
- chat: multi-turn conversations under one system prompt, each turn resending its whole history.

``distinct_prefix_tokens`` counts the nodes of the token trie of all prompts: the least number of
prompt tokens any engine must compute. ``block_cache_min_tokens`` is the least a block-granular
prefix cache that never serves a prompt's last token can compute (with unlimited memory). Both live in
prefixflow.pipeline.advisor.sharing (the workload advisor reports them for a user's own data).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from benchmarks.common import random_tokens
from prefixflow.pipeline.advisor.sharing import block_cache_min_tokens, distinct_prefix_tokens

__all__ = ["Workload", "block_cache_min_tokens", "distinct_prefix_tokens"]


@dataclass
class Workload:
    name: str
    prompts: list[list[int]]
    max_tokens: list[int]
    params: dict = field(default_factory=dict)

    @property
    def prompt_tokens(self) -> int:
        return sum(map(len, self.prompts))

    def describe(self) -> dict:
        return {
            "name": self.name,
            "requests": len(self.prompts),
            "prompt_tokens": self.prompt_tokens,
            "output_tokens": sum(self.max_tokens),
            "distinct_prefix_tokens": distinct_prefix_tokens(self.prompts),
            **self.params,
        }


def _around(rng: random.Random, mean: int, spread: float = 0.2) -> int:
    """An integer uniform within ``mean`` ± spread (at least 1)."""
    lo, hi = max(1, round(mean * (1 - spread))), max(1, round(mean * (1 + spread)))
    return rng.randint(lo, hi)


def labeling(
    vocab_size: int,
    num_prefixes: int = 16,
    num_docs: int = 64,
    prefix_len: int = 1000,
    doc_len: int = 300,
    output_len: int = 8,
    scale: float = 1.0,
    seed: int = 0,
) -> Workload:
    """``num_prefixes`` instructions x ``num_docs`` documents, rows shuffled; lengths ±20 % (× scale)."""
    rng = random.Random(seed)
    p_len, d_len = max(1, round(prefix_len * scale)), max(1, round(doc_len * scale))
    prefixes = [random_tokens(rng, _around(rng, p_len), vocab_size) for _ in range(num_prefixes)]
    docs = [random_tokens(rng, _around(rng, d_len), vocab_size) for _ in range(num_docs)]
    rows = [(p + d, _around(rng, output_len, 0.25)) for p in prefixes for d in docs]
    rng.shuffle(rows)
    params = dict(
        num_prefixes=num_prefixes,
        num_docs=num_docs,
        prefix_len=p_len,
        doc_len=d_len,
        output_len=output_len,
        scale=scale,
        seed=seed,
    )
    return Workload("labeling", [r[0] for r in rows], [r[1] for r in rows], params)


def chat(
    vocab_size: int,
    num_conversations: int = 32,
    turns: int = 6,
    system_len: int = 500,
    user_len: int = 150,
    assistant_len: int = 150,
    output_len: int = 32,
    scale: float = 1.0,
    seed: int = 0,
) -> Workload:
    """Every turn of every conversation is one request: system prompt + the history so far + the new
    user message. Earlier assistant replies are synthetic (all turns are submitted at once). Rows shuffled.
    """
    rng = random.Random(seed)
    s_len, u_len, a_len = (max(1, round(x * scale)) for x in (system_len, user_len, assistant_len))
    system = random_tokens(rng, s_len, vocab_size)
    rows = []
    for _ in range(num_conversations):
        history = list(system)
        for _ in range(turns):
            history += random_tokens(rng, _around(rng, u_len), vocab_size)
            rows.append((list(history), _around(rng, output_len, 0.25)))
            history += random_tokens(rng, _around(rng, a_len), vocab_size)
    rng.shuffle(rows)
    params = dict(
        num_conversations=num_conversations,
        turns=turns,
        system_len=s_len,
        user_len=u_len,
        assistant_len=a_len,
        output_len=output_len,
        scale=scale,
        seed=seed,
    )
    return Workload("chat", [r[0] for r in rows], [r[1] for r in rows], params)
