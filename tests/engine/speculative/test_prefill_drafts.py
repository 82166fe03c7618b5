"""Drafting in the last prompt chunk (decoder.py ``prefill_drafts``): the step that samples a request's
first token also verifies drafts of the tokens after it (a structured output's forced opening, or a
lookup over the prompt), so each request needs one step fewer. Outputs stay those of speculation off,
greedy and seeded, with chunked prefill, a tight token budget and prompt log-probs; no block leaks."""

from __future__ import annotations

from prefixflow.engine import LLM, SamplingParams
from tests.engine.speculative.helpers import prompts
from tests.engine.speculative.test_jump_forward import AUTO, ENGINE, JSON, NGRAM4


def _spy_attached(llm: LLM) -> list[int]:
    """The real ``attach_drafts``, noting how many drafts each call attached."""
    scheduler = llm.engine.scheduler
    attach, counts = scheduler.attach_drafts, []

    def spy(scheduled, drafts):
        out = attach(scheduled, drafts)
        counts.append(sum(c.num_tokens for c in out) - sum(c.num_tokens for c in scheduled))
        return out

    scheduler.attach_drafts = spy  # type: ignore[method-assign]
    return counts


def _all_blocks_free(llm: LLM) -> bool:
    kv = llm.engine.kv
    return kv.pool.num_free == kv.num_blocks


def test_the_first_step_verifies_forced_drafts_one_step_fewer_per_request():
    items = prompts(4, seed=73)
    params = SamplingParams(temperature=0.0, max_tokens=32, structured=JSON)
    with_prefill = LLM("tiny", speculative_config=NGRAM4, **ENGINE)
    without = LLM("tiny", speculative_config=dict(NGRAM4, prefill_drafts=False), **ENGINE)  # = off's tokens
    attached = _spy_attached(with_prefill)
    for item in items:  # batch 1: each request's prompt is one chunk, which samples its first token
        want = [o.token_ids for o in without.generate([item], params)]
        assert [o.token_ids for o in with_prefill.generate([item], params)] == want
    assert len(attached) == len(items) and all(n > 0 for n in attached)  # the opening '{"' is forced
    saved = without.stats().steps - with_prefill.stats().steps
    assert saved >= len(items) // 2  # at least one step saved in most requests (none is ever lost)
    assert _all_blocks_free(with_prefill)
    # the per-step token count (progress display) counts settled tokens, not the drafts of a run
    assert with_prefill.stats().generated_tokens == with_prefill.stats().output_tokens


def test_seeded_chunked_prefill_tight_budget_and_prompt_logprobs_unchanged():
    """Prompts in chunks of a 20-token budget (drafts go only on the last chunk, cut to what the budget
    leaves), seeded sampling, and requests that score their prompt (never drafted in prefill)."""
    items = prompts(7, seed=79)
    params = [
        SamplingParams(
            temperature=0.8, seed=i, max_tokens=24, structured=JSON, prompt_logprobs=1 if i % 3 == 0 else None
        )
        for i in range(7)
    ]
    tight = dict(ENGINE, max_num_batched_tokens=20, max_num_seqs=4)
    off = LLM("tiny", **tight).generate(items, params)
    for spec in (NGRAM4, AUTO):
        llm = LLM("tiny", speculative_config=spec, **tight)
        attached = _spy_attached(llm)
        on = llm.generate(items, params)
        assert [o.token_ids for o in on] == [o.token_ids for o in off]
        assert [o.prompt_logprobs for o in on] == [o.prompt_logprobs for o in off]
        assert _all_blocks_free(llm)
        if spec is NGRAM4:
            assert sum(attached) > 0
