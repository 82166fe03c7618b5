"""A draft model in the same process, with its own KV pool: greedy and seeded sampling identical to
speculation off; a draft with another tokenizer is refused and a larger one warned about, before any
request runs."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams
from tests.engine.speculative.draft_models import grown_tiny, larger, other_vocabulary
from tests.engine.speculative.helpers import prompts, run
from tests.engine.tp_support import assert_processes_gone

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


def test_draft_identical_under_preemption_and_chunked_prefill(target):
    """Preempted target requests drop their shadows (freed from the draft's pool) and get new ones when
    they run again; chunked prefill on the target, prompts in chunks on the draft."""
    items = prompts(16, seed=21)
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    tight = dict(ENGINE, num_kv_blocks=40, max_num_batched_tokens=20, max_num_seqs=12)
    off, _, _ = run(target, items, greedy, None, **ENGINE)
    llm = LLM(target, speculative_config=DRAFT, **tight)
    draft = llm.engine.speculator.proposer
    forget, dropped_while_preempted = draft.forget, []

    def spy(live: set[int]) -> None:  # the real forget, noting shadows whose target went back to waiting
        waiting = {r.key for r in llm.engine.scheduler.waiting}
        dropped_while_preempted.extend(k for k in draft.shadows if k not in live and k in waiting)
        forget(live)

    draft.forget = spy
    on = [o.token_ids for o in llm.generate(items, greedy)]
    stats = llm.stats()
    assert on == off
    assert stats.preemptions > 0 and dropped_while_preempted  # a preempted request had drafted
    assert stats.speculation["draft_model"]["accepted"] > 0
    assert not draft.shadows and draft.kv.pool.num_free == draft.kv.num_blocks
    assert llm.engine.kv.pool.num_free == llm.engine.kv.num_blocks


@pytest.mark.slow
def test_draft_under_tensor_parallel_two_ranks_identical(target):
    """The draft runs once, in the driver (rank 0 proposes); both gloo ranks of the target verify."""
    items = prompts(7, seed=22)
    greedy = SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True)
    seeded = [
        SamplingParams(temperature=0.7, top_k=4, seed=i, max_tokens=16, ignore_eos=True) for i in range(7)
    ]
    off_greedy, _, _ = run(target, items, greedy, None, **ENGINE)
    off_seeded, _, _ = run(target, items, seeded, None, **ENGINE)
    with LLM(target, tensor_parallel_size=2, speculative_config=DRAFT, **ENGINE) as llm:
        assert llm.engine.runner.pool is not None
        pids = llm.engine.runner.pool.pids
        draft = llm.engine.speculator.proposer
        assert draft.runner.pool is None  # the draft is not sharded: it runs in the driver
        assert [o.token_ids for o in llm.generate(items, greedy)] == off_greedy
        assert [o.token_ids for o in llm.generate(items, seeded)] == off_seeded
        spec = llm.stats().speculation["draft_model"]
        assert 0 < spec["accepted"] < spec["proposed"]
    assert_processes_gone(pids)


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
        LLM(
            "tiny",
            speculative_config={
                "method": "draft_model",
                "model": str(larger(tmp_path)),
                "num_speculative_tokens": 2,
            },
            **ENGINE,
        )
