"""A draft model in the same process, with its own KV pool: greedy and seeded sampling identical to
speculation off; a draft with another tokenizer is refused and a larger one warned about, before any
request runs."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams
from tests.engine.speculative.draft_models import grown_tiny, larger, other_vocabulary
from tests.engine.speculative.helpers import prompts, run

ENGINE = dict(dtype="float32", device="cpu", block_size=4, num_kv_blocks=2048)  # a small pool: fast to build
DRAFT = {"method": "draft_model", "model": "tiny", "num_speculative_tokens": 3}


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    return str(grown_tiny(tmp_path_factory.mktemp("draft_targets")))


@pytest.mark.parametrize("batch", [1, 7])
def test_draft_greedy_identical_to_spec_off(target, batch):
    items = prompts(batch, seed=40 + batch)
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    off, _, _ = run(target, items, greedy, None, **ENGINE)
    on, stats, llm = run(target, items, greedy, DRAFT, **ENGINE)
    assert on == off
    spec = stats.speculation["draft_model"]
    assert 0 < spec["accepted"] < spec["proposed"]
    draft = llm.engine.speculator.proposer
    assert draft.kv.pool is not llm.engine.kv.pool  # its own pool
    assert draft.kv.pool.num_free == draft.kv.num_blocks  # every shadow freed once its request finished


def test_draft_seeded_sampling_identical_and_prefix_cache_hits(target):
    items = prompts(7, seed=9)
    params = [
        SamplingParams(temperature=0.6, top_k=5, seed=i, max_tokens=24, ignore_eos=True) for i in range(7)
    ]
    off, _, _ = run(target, items, params, None, **ENGINE)
    on, stats, llm = run(target, items, params, DRAFT, **ENGINE)
    assert on == off
    assert stats.speculation["draft_model"]["accepted"] > 0
    again = llm.generate(items[:1], params[0])  # the draft's own prefix cache serves the repeat
    assert again[0].token_ids == on[0]
    assert llm.engine.speculator.proposer.kv.pool.cached


def test_draft_with_another_vocabulary_is_refused(tmp_path):
    with pytest.raises(
        ValueError, match=r"does not share the target's tokenizer \(vocabulary size 384 \(draft\) vs 512"
    ):
        LLM(
            "tiny",
            speculative_config={"method": "draft_model", "model": str(other_vocabulary(tmp_path))},
            **ENGINE,
        )


def test_draft_larger_than_target_warns(tmp_path):
    with pytest.warns(UserWarning, match="not fewer than the target's"):
        LLM("tiny", speculative_config={"method": "draft_model", "model": str(larger(tmp_path)),
                                        "num_speculative_tokens": 2}, **ENGINE)  # fmt: skip
