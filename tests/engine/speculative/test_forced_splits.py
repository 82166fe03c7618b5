"""Grammar-forced drafts learn the target's own split of each forced string (forced.py): the model
does not always spell a literal the way its tokenizer encodes it, and a draft in the encoding's split is
then rejected at the first differing token. Outputs stay those of speculation off."""

from __future__ import annotations

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.speculative.forced import ForcedDrafts, Pending
from tests.engine.speculative.helpers import prompts
from tests.engine.speculative.test_jump_forward import ENGINE, JSON, NGRAM4


def _matcher_after(llm: LLM, text: str):
    matcher = llm.engine.structured.new_matcher(JSON)
    ids = llm.engine.tokenizer.encode(text, add_special_tokens=False)
    for t in ids:
        assert matcher.accept_token(t)
    return matcher, list(ids)


def test_the_target_split_is_learned_and_proposed_the_majority_wins():
    llm = LLM("tiny", **ENGINE)
    tok = llm.engine.tokenizer
    structured = llm.engine.structured
    forced = ForcedDrafts(tok, structured.token_bytes)
    matcher, real = _matcher_after(llm, '{"sentiment": "mixed')
    text = matcher.find_jump_forward_string()
    canonical = list(tok.encode(text, add_special_tokens=False))
    colon, quote, pair = (tok.convert_tokens_to_ids(t) for t in (":", '"', '":'))
    assert pair in canonical  # the encoding spells '":' as one token; the "model" below spells it '"' + ':'
    split = []
    for t in canonical:
        split += [quote, colon] if t == pair else [t]
    pending: list[Pending] = []
    drafts, _ = forced.propose(matcher, real, None, 20, pending)
    assert drafts == canonical and [p.text for p in pending] == [text.encode()]
    for t in split:  # what the target emitted
        assert matcher.accept_token(t)
    forced.learn(pending, real + split)
    assert pending == [] and forced.learned_splits == 1
    fresh, _ = _matcher_after(llm, '{"sentiment": "mixed')
    drafts, marks = forced.propose(fresh, real, None, 20)
    assert drafts == split and all(marks)
    # a second spelling seen once more than the first wins; on a tie the most recent one is proposed
    key = text.encode()
    forced._observe(key, tuple(canonical))
    assert forced.split(text) == tuple(canonical)
    forced._observe(key, tuple(canonical))
    assert forced.split(text) == tuple(canonical)
    forced._observe(key, tuple(split))
    forced._observe(key, tuple(split))
    assert forced.split(text) == tuple(split)


def test_a_string_the_model_runs_past_learns_an_empty_split():
    """When the target's first token already spells past the forced string (a quote merged with the
    value after it), nothing is forced-drafted there next time."""
    llm = LLM("tiny", **ENGINE)
    forced = ForcedDrafts(llm.engine.tokenizer, llm.engine.structured.token_bytes)
    vocab = llm.engine.structured.token_bytes()
    merged = next(i for i, b in enumerate(vocab) if len(b) > 1 and b.startswith(b"a"))
    pending = [Pending(3, b"a")]
    forced.learn(pending, [1, 2, 3, merged])
    assert pending == [] and forced.split("a") == ()
    waiting = [Pending(3, b"ab")]
    forced.learn(waiting, [1, 2, 3])  # the target has not reached it yet: kept
    assert waiting == [Pending(3, b"ab")]


def test_learning_raises_forced_acceptance_outputs_unchanged():
    """16 rows of one schema, 4 at a time: drafting the target's own splits lifts the forced drafts'
    acceptance (0.74 with the encoding's split on this model and prompts, 0.88 learned)."""
    items = prompts(16, seed=67)
    params = SamplingParams(temperature=0.0, max_tokens=48, structured=JSON)
    off = LLM("tiny", **ENGINE)
    on = LLM("tiny", speculative_config=NGRAM4, **ENGINE)
    for i in range(0, 16, 4):
        want = [o.token_ids for o in off.generate(items[i : i + 4], params)]
        assert [o.token_ids for o in on.generate(items[i : i + 4], params)] == want
    stats = on.stats().speculation["jump_forward"]
    assert stats["accepted"] / stats["proposed"] > 0.85
    assert on.engine.speculator.forced.learned_splits > 0
    kv = on.engine.kv
    assert kv.pool.num_free == kv.num_blocks
