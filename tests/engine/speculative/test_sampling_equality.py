"""Sampling with speculation: for a fixed seed the tokens are the ones speculation-off draws (noise is a
function of (seed, position), and every emitted token is the plain sampler's), and the distribution of
a short continuation matches plain sampling (two-sample chi-square, 10k samples each)."""

from __future__ import annotations

import math
from collections import Counter

import pytest

from prefixflow.engine import LLM, SamplingParams
from tests.engine.speculative.helpers import prompts, run

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
ENGINE = dict(dtype="float32", device="cpu", block_size=4, num_kv_blocks=2048)  # a small pool: fast to build


@pytest.mark.parametrize("batch", [1, 7])
def test_seeded_sampling_identical_on_and_off(batch):
    items = prompts(batch, seed=20 + batch)
    params = [
        SamplingParams(temperature=0.5, top_k=2, top_p=0.95, seed=100 + i, max_tokens=40, ignore_eos=True)
        for i in range(batch)
    ]
    off, _, _ = run("tiny", items, params, None, **ENGINE)
    on, stats, _ = run("tiny", items, params, NGRAM, **ENGINE)
    assert on == off
    ngram = stats.speculation["ngram"]
    assert 0 < ngram["accepted"] < ngram["proposed"]


def test_n_greater_than_one_identical_on_and_off():
    items = prompts(3, seed=8)
    params = SamplingParams(n=3, temperature=0.5, top_k=2, seed=5, max_tokens=24, ignore_eos=True)
    a = LLM("tiny", **ENGINE).generate(items, params)
    llm = LLM("tiny", speculative_config=NGRAM, **ENGINE)
    b = llm.generate(items, params)
    assert [[c.token_ids for c in o.outputs] for o in a] == [[c.token_ids for c in o.outputs] for o in b]
    assert llm.stats().speculation["ngram"]["accepted"] > 0


def chi2_quantile(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z=3.09: p = 0.999)."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def looping_prompt() -> list[int]:
    """A prompt ending in the tiny model's own greedy loop, so the lookup's proposals are often right."""
    seed = [11, 402, 57, 300, 9]
    out = LLM("tiny", **ENGINE).generate(
        [seed], SamplingParams(temperature=0.0, max_tokens=60, ignore_eos=True)
    )
    return seed + list(out[0].token_ids)


def continuations(spec: dict | None, seeds: range) -> Counter:
    prompt = looping_prompt()
    params = [SamplingParams(temperature=1.0, top_k=3, seed=s, max_tokens=3, ignore_eos=True) for s in seeds]
    llm = LLM("tiny", speculative_config=spec, max_num_seqs=512, **{**ENGINE, "num_kv_blocks": 16384})
    outs = llm.generate([prompt] * len(seeds), params)
    if spec is not None:
        assert llm.stats().speculation["ngram"]["accepted"] > 500  # the verified path did the sampling
    return Counter(o.token_ids for o in outs)


@pytest.mark.slow
def test_continuation_distribution_matches_plain_sampling():
    n = 10_000
    on = continuations(NGRAM, range(n))
    off = continuations(None, range(n, 2 * n))  # other seeds: an independent sample of the plain sampler
    cells = [c for c in set(on) | set(off) if on[c] + off[c] >= 10]
    rare_on = n - sum(on[c] for c in cells)
    rare_off = n - sum(off[c] for c in cells)
    table = [(on[c], off[c]) for c in cells] + ([(rare_on, rare_off)] if rare_on + rare_off else [])
    stat = sum((a - b) ** 2 / (a + b) for a, b in table)  # equal sample sizes
    assert len(table) > 10
    assert stat < chi2_quantile(len(table) - 1), (stat, len(table))
    # and it can fail: a sampler that always accepts the draft is far outside the tolerance
    skewed = Counter({c: v for c, v in on.items()})
    skewed[max(on, key=on.get)] += n // 5
    skewed_stat = sum((skewed[c] - off[c]) ** 2 / (skewed[c] + off[c]) for c in cells)
    assert skewed_stat > chi2_quantile(len(table) - 1)
