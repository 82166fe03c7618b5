"""Batch-invariant scoring on the embedded model, in the dtype the CPU default resolves to and in
float32: a review's label scores are the same bits scored alone, beside other reviews, and after a
prefix-cache hit (benchmarks/batch_invariant_bench.py measured the default path differing in all 8 of 8
rows, by up to 4e-6 nats)."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM

LABELS = [" positive", " negative", " neutral"]
REVIEWS = [
    "The battery died after two days, very disappointed.",
    "Great sound, comfortable fit, would buy again.",
    "It arrived late but works fine.",
    "Terrible customer service and the screen cracked.",
    "Does what it says. Nothing special.",
    "I love the color and the size is perfect.",
]


@pytest.mark.slow  # loads the embedded model five times (~60 s)
@pytest.mark.parametrize("dtype", ["auto", "float32"])
def test_a_reviews_scores_are_the_same_bits_whatever_is_scored_beside_it(dtype: str) -> None:
    prompts = [f"Review: {text}\nVerdict:" for text in REVIEWS]

    def engine() -> LLM:
        return LLM("smollm2-135m-instruct", dtype=dtype, batch_invariant=True)

    alone = engine().score_choices(prompts[2:3], [LABELS])[0]
    assert isinstance(alone, list) and len(alone) == 3
    beside = engine().score_choices(prompts, [LABELS] * len(prompts))[2]
    warm = engine()
    warm.score_choices(["Review: It arrived late but works"], [LABELS])  # a shared prefix, cached
    after_hit = warm.score_choices(prompts[2:3], [LABELS])[0]
    assert beside == alone
    assert after_hit == alone
