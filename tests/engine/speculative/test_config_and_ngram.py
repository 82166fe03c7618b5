"""Bad speculative configs fail before any work, with what to fix; the indexed n-gram lookup gives the
scan's answer while touching a constant amount of state per new token."""

from __future__ import annotations

import random

import pytest

from prefixflow.engine import LLM
from prefixflow.engine.config import EngineConfig
from prefixflow.engine.speculative.config import SpeculativeConfig
from prefixflow.engine.speculative.ngram import NgramIndex, scan_propose


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"method": "medusa"}, "method='medusa' is invalid; expected one of ngram, draft_model"),
        ({"method": "ngram", "num_speculative_tokens": -1}, "num_speculative_tokens=-1 is invalid"),
        ({"method": "ngram", "num_speculative_tokens": "many"}, "expected 'auto' or an integer >= 0"),
        (
            {"method": "ngram", "prompt_lookup_min": 4, "prompt_lookup_max": 2},
            "prompt_lookup_min=4 is invalid",
        ),
        ({"method": "ngram", "lookahead": 3}, "unknown key(s) ['lookahead']"),
        ({"num_speculative_tokens": 3}, "needs a 'method'"),
        ({"method": "draft_model"}, "needs speculative_config.model"),
        ("ngram", "must be a mapping"),
    ],
)
def test_bad_configs_say_what_to_fix(spec, message):
    with pytest.raises(ValueError) as err:
        EngineConfig(speculative_config=spec)
    assert message in str(err.value)


def test_bad_config_fails_before_loading_the_model(tmp_path):
    with pytest.raises(ValueError, match="num_speculative_tokens"):
        LLM(
            str(tmp_path / "not-a-model"),
            speculative_config={"method": "ngram", "num_speculative_tokens": -2},
        )


def test_mapping_becomes_a_frozen_config_with_auto_as_default():
    cfg = EngineConfig(speculative_config={"method": "ngram"}).speculative_config
    assert isinstance(cfg, SpeculativeConfig) and cfg.auto and cfg.max_k == cfg.max_speculative_tokens
    assert (
        EngineConfig(
            speculative_config={"method": "ngram", "num_speculative_tokens": 3}
        ).speculative_config.max_k
        == 3
    )


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("most", [1, 40])
def test_index_matches_the_scan_as_tokens_arrive(seed, most):
    """One token at a time (a decode step), or up to 40 at once (a prompt, or the tokens of steps
    whose lookups were skipped, indexed in one call)."""
    rng = random.Random(seed)
    vocab = rng.choice([2, 3, 5, 20])
    min_n, max_n = sorted(rng.sample(range(1, 6), 2))
    index = NgramIndex(min_n, max_n)
    tokens: list[int] = []
    for _ in range(150 if most == 1 else 30):
        tokens.extend(rng.randrange(vocab) for _ in range(rng.randrange(1, most + 1)))
        k = rng.randrange(0, 6)
        assert index.propose(tokens, k) == scan_propose(tokens, k, min_n, max_n)


def test_index_work_per_token_is_constant():
    """Each token adds at most one entry per n-gram length, however long the context is."""
    index = NgramIndex(2, 4)
    tokens = [i % 97 for i in range(5000)]
    index.propose(tokens, 3)
    sizes = sum(len(t) for t in index.tables)
    tokens.append(5)
    index.propose(tokens, 3)
    assert sum(len(t) for t in index.tables) - sizes <= 3
    assert index.indexed == len(tokens)


def test_longest_match_wins_then_most_recent():
    index = NgramIndex(1, 3)
    # "1 2 3" was followed by 4; "2 3" alone most recently by 9; the longer match decides
    tokens = [1, 2, 3, 4, 0, 2, 3, 9, 1, 2, 3]
    assert index.propose(tokens, 2) == [4, 0]
    assert NgramIndex(1, 2).propose(tokens, 2) == [9, 1]
