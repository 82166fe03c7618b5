"""Shared pieces of the speculative-decoding tests: prompts that repeat (so lookups hit) and a runner
that returns tokens and the engine's counters, with speculation on or off."""

from __future__ import annotations

import random
from typing import Any

from prefixflow.engine import LLM, SamplingParams

AUTO_NGRAM = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}  # auto k, short n-grams
SHARED = [7, 19, 3, 44, 5, 61, 8, 90, 12, 33, 4, 71, 28, 9, 15, 66, 2, 40]  # a common prefix (cache hits)


def prompts(count: int, seed: int = 0, vocab: int = 512) -> list[list[int]]:
    """Half copy-heavy (a span quoted twice: the lookup has something to find), half random."""
    rng = random.Random(seed)
    out = []
    for i in range(count):
        span = [rng.randrange(vocab) for _ in range(rng.randrange(4, 12))]
        tail = [rng.randrange(vocab) for _ in range(rng.randrange(1, 9))]
        body = span + tail + span if i % 2 == 0 else tail + span
        out.append((SHARED if i % 3 == 0 else []) + body)
    return out


def run(
    model: Any,
    items: list[list[int]],
    params: SamplingParams | list[SamplingParams],
    spec: dict[str, Any] | None,
    **engine: Any,
) -> tuple[list[tuple[int, ...]], Any, LLM]:
    llm = LLM(model, speculative_config=spec, **engine)
    outs = llm.generate(items, params)
    assert all(o.finish_reason != "error" for o in outs), [o.error for o in outs if o.error]
    return [o.token_ids for o in outs], llm.stats(), llm
