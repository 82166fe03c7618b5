"""Grammar-forced drafts (jump-forward): a structured-output request drafts what its grammar forces, the
lookup continues after it, verification stays exact. Outputs equal speculation off (greedy and seeded),
forced drafts are accepted and sometimes rejected (rolled back: no leaked blocks, the matcher keeps only
real tokens), and the auto policy takes near-certain forced drafts where it would not take lookups."""

from __future__ import annotations

from prefixflow.engine import LLM, SamplingParams, StructuredOutputs
from prefixflow.engine.speculative.cost_model import LinearCost
from prefixflow.engine.speculative.forced import ForcedDrafts
from prefixflow.engine.speculative.ngram import NgramIndex
from prefixflow.engine.speculative.policy import Candidate, plan_drafts
from prefixflow.engine.structured.bitmask import allocate_bitmask
from tests.engine.speculative.helpers import prompts, run

ENGINE = dict(dtype="float32", device="cpu", block_size=4, num_kv_blocks=2048)  # a small pool: fast to build
NGRAM4 = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
AUTO = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative", "mixed"]},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["sentiment", "tags", "stars"],
    "additionalProperties": False,
}
JSON = StructuredOutputs(json_schema=SCHEMA)


def test_auto_greedy_identical_and_forced_drafts_accepted_at_batch_1():
    items = prompts(1, seed=61)
    params = SamplingParams(temperature=0.0, max_tokens=48, structured=JSON)
    off, off_stats, _ = run("tiny", items, params, None, **ENGINE)
    on, stats, _ = run("tiny", items, params, AUTO, **ENGINE)
    assert on == off
    assert stats.speculation["jump_forward"]["accepted"] > 0
    assert stats.steps < off_stats.steps


def test_forced_drafts_accepted_and_rejected_batch_7_outputs_unchanged():
    """The tokenizer's split of a forced string is not always the model's: those drafts are rejected
    and rolled back (blocks given back), and the run goes on with the model's own token."""
    items = prompts(7, seed=67)
    params = SamplingParams(temperature=0.0, max_tokens=48, structured=JSON)
    off, off_stats, _ = run("tiny", items, params, None, **ENGINE)
    on, stats, llm = run("tiny", items, params, NGRAM4, **ENGINE)
    assert on == off
    forced = stats.speculation["jump_forward"]
    assert 0 < forced["accepted"] < forced["proposed"]
    assert stats.steps < off_stats.steps
    kv = llm.engine.kv
    assert kv.pool.num_free == kv.num_blocks


def test_seeded_sampling_identical_with_forced_drafts():
    items = prompts(7, seed=61)
    params = [SamplingParams(temperature=0.8, seed=i, max_tokens=40, structured=JSON) for i in range(7)]
    off, _, _ = run("tiny", items, params, None, **ENGINE)
    on, stats, _ = run("tiny", items, params, NGRAM4, **ENGINE)
    assert on == off
    assert stats.speculation["jump_forward"]["accepted"] > 0


def test_jump_forward_off_proposes_no_forced_drafts():
    items = prompts(3, seed=62)
    params = SamplingParams(temperature=0.0, max_tokens=32, structured=JSON)
    off, _, _ = run("tiny", items, params, None, **ENGINE)
    on, stats, _ = run("tiny", items, params, dict(NGRAM4, jump_forward=False), **ENGINE)
    assert on == off
    assert "jump_forward" not in stats.speculation


def test_propose_leaves_the_matcher_where_it_was():
    """Forced drafts come first, each admitted by the grammar; the lookup continues after them; the
    matcher is rolled back to the request's real output (same forced string, same mask)."""
    llm = LLM("tiny", **ENGINE)
    tok = llm.engine.tokenizer
    matcher = llm.engine.structured.new_matcher(JSON)
    vocab = llm.engine.model_cfg.vocab_size
    for t in tok.encode('{"sentiment": "mixed', add_special_tokens=False):
        assert matcher.accept_token(t)
    before = allocate_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(before, 0)
    text = matcher.find_jump_forward_string()
    assert text.startswith('", "tags": [')
    forced_ids = list(tok.encode(text, add_special_tokens=False))
    prompt = tok.encode('x "ab", "cd"] y', add_special_tokens=False)  # the lookup's source: '"ab", ...'
    real = prompt + tok.encode('{"sentiment": "mixed', add_special_tokens=False)
    index = NgramIndex(1, 3)
    drafts, forced = ForcedDrafts(tok).propose(matcher, real, index, 12)
    n = sum(forced)
    assert drafts[:n] == forced_ids[:n] and n == min(len(forced_ids), 12)
    assert forced == [True] * n + [False] * (len(drafts) - n)
    after = allocate_bitmask(1, vocab)
    matcher.fill_next_token_bitmask(after, 0)
    assert matcher.find_jump_forward_string() == text and bool((before == after).all())
    for t in drafts:  # every draft is one the grammar admits, in order
        assert matcher.accept_token(t)
    assert index.indexed <= len(real)  # drafts are never indexed


def test_policy_takes_forced_drafts_a_lookup_would_not_get():
    """A step costing a fixed 10 ms + 1 ms per token (batch 1): near-certain forced drafts pay, the
    unlikely looked-up drafts after them do not, and the cut falls between them."""
    cost = LinearCost(3)
    for tokens in range(1, 30):
        cost.observe([float(tokens), 1.0 + tokens % 3, float(tokens % 2)], 0.010 + 0.001 * tokens)
    mixed = Candidate((0.95, 0.95, 0.95, 0.2, 0.2))
    assert plan_drafts([mixed], 1, 1, cost) == [3]
    assert plan_drafts([Candidate.uniform(5, 0.05)], 1, 1, cost) == [0]
    assert Candidate((0.5, 0.5)).gains() == [0.5, 0.25]


def test_policy_prices_each_draft_length_a_step_adds():
    """Batch 64, 1 ms per token over a 100 ms step: drafts of acceptance 0.6 pay while a new draft length
    costs nothing, and not once the fit has seen that each one adds 50 ms (its own attention chunks)."""

    def fitted(per_length: float) -> LinearCost:
        cost = LinearCost(3)
        for step in range(60):
            tokens, lengths = 64 + 23 * (step % 7) + 9 * (step % 3), step % 3
            cost.observe(
                [float(tokens), float(tokens), float(lengths)], 0.1 + 0.001 * tokens + per_length * lengths
            )
        return cost

    batch = [Candidate.uniform(4, 0.6) for _ in range(64)]
    assert sum(plan_drafts(batch, 64, 64, fitted(0.0))) > 0
    assert plan_drafts(batch, 64, 64, fitted(0.05)) == [0] * 64
