"""Property test: random accept/reject patterns from an adversarial proposer never leak a block, never
hash a rejected token into the prefix cache, never leave KV that disagrees with the request's tokens,
and never change what is generated. The scheduler is driven through its real step interface; a
deterministic function of the token prefix stands in for the model, so the expected output is known."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixflow.engine.core.block_pool import chain_hash
from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.request import Request, Status
from prefixflow.engine.core.scheduler import Scheduler, SchedulerLimits
from prefixflow.engine.core.step_types import ModelOutput
from prefixflow.engine.sampling.sampling_params import SamplingParams
from prefixflow.engine.sampling.stop_checker import StopChecker
from tests.engine.core.test_scheduler_properties import apply_copies, check_invariants

VOCAB = 7  # few tokens: proposals that copy the true continuation are often right


def true_next(prefix: list[int]) -> int:
    """The 'model': the next token is a function of the whole prefix (like greedy decoding)."""
    return hash(tuple(prefix[-6:]) + (len(prefix) % 5,)) % VOCAB


def reference(prompt: list[int], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(true_next(tokens))
    return tokens


def simulate(seed: int, num_blocks: int, block_size: int, budget: int, max_seqs: int, caching: bool):
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks, block_size, caching)
    sched = Scheduler(SchedulerLimits(max_seqs, budget), kv, StopChecker(None, (), 10**9))
    capacity = num_blocks * block_size
    prefixes = [[rng.randrange(VOCAB) for _ in range(rng.randrange(0, 12))] for _ in range(3)]
    pending, expected = [], {}
    for i in range(rng.randrange(1, 12)):
        prompt = rng.choice(prefixes) + [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 10))]
        max_tokens = rng.randrange(1, 40)
        if len(prompt) + max_tokens - 1 > capacity:
            continue
        req = Request(i, str(i), prompt, SamplingParams(), max_tokens, seed=i)
        pending.append(req)
        expected[req.key] = reference(prompt, max_tokens)
    valid_hashes: set[int] = set()
    for ref in expected.values():
        parent = None
        for b in range(len(ref) // block_size):
            parent = chain_hash(parent, ref[b * block_size : (b + 1) * block_size])
            valid_hashes.add(parent)
    total, finished, shadow = len(pending), 0, {}
    proposed = accepted = 0
    for _ in range(20000):
        while pending and rng.random() < 0.5:
            sched.add(pending.pop(0))
        if not sched.has_work():
            if not pending:
                break
            continue
        for req in sched.running:  # the adversary: part of the true continuation, then noise
            if req.num_computed_tokens == req.num_tokens - 1 and req.num_output_tokens and rng.random() < 0.8:
                k = min(rng.randrange(1, 6), req.max_tokens - req.num_output_tokens - 1)
                if k <= 0:
                    continue
                truth = reference(req.token_ids, k)[req.num_tokens :]
                right = rng.randrange(k + 1)
                draft = truth[:right] + [rng.randrange(VOCAB) for _ in range(k - right)]
                req.token_ids.extend(draft)
                req.num_draft_tokens = k
        step = sched.schedule()
        assert step, "no progress"
        apply_copies(kv.take_copies(), shadow, kv.block_size)  # as the engine does before the forward pass
        model = ModelOutput()
        for chunk in step:
            req = chunk.request
            begin = req.num_computed_tokens
            for pos in range(begin, begin + chunk.num_tokens):
                slot = chunk.block_table[pos // block_size] * block_size + pos % block_size
                shadow[slot] = req.token_ids[pos]
            if begin + chunk.num_tokens == req.num_tokens:
                if req.num_draft_tokens:
                    first = req.num_tokens - req.num_draft_tokens
                    targets = [true_next(req.token_ids[:end]) for end in range(first, req.num_tokens + 1)]
                    model.verified[req.key] = targets
                    proposed += req.num_draft_tokens
                else:
                    model.sampled[req.key] = true_next(req.token_ids)
        done = sched.update_from_output(step, model)
        for req in done:
            assert req.status is Status.FINISHED and req.finish_reason == "length"
            assert req.token_ids == expected[req.key]
        finished += len(done)
        for req in sched.running:
            assert req.num_draft_tokens == 0
            assert req.token_ids == expected[req.key][: req.num_tokens]
            computed_blocks = -(-req.num_computed_tokens // block_size)
            assert len(kv.block_table(req)) <= computed_blocks, (
                "blocks past the computed tokens outlived a run"
            )
        check_invariants(kv, sched, shadow)
        assert set(kv.pool.cached) <= valid_hashes, "a rejected token was hashed into the prefix cache"
    assert finished == total
    assert kv.pool.num_free == num_blocks and all(b.ref_count == 0 for b in kv.pool.blocks)
    accepted = sum(sched.speculation.accepted.values())
    return sched, kv, proposed, accepted


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    num_blocks=st.integers(6, 40),
    block_size=st.sampled_from([2, 4, 8]),
    budget=st.integers(1, 64),
    max_seqs=st.integers(1, 8),
    caching=st.booleans(),
)
def test_random_accept_reject_patterns_never_leak_or_corrupt(
    seed, num_blocks, block_size, budget, max_seqs, caching
):
    simulate(seed, num_blocks, block_size, budget, max_seqs, caching)


def test_the_simulation_accepts_rejects_and_preempts():
    """The property is only as good as the paths it reaches: partial accepts, preemption, cache hits."""
    preemptions = proposed = accepted = 0
    for seed in range(20):
        sched, kv, p, a = simulate(seed, num_blocks=16, block_size=4, budget=16, max_seqs=8, caching=True)
        preemptions += sched.num_preemptions
        proposed += p
        accepted += a
    assert preemptions > 0
    assert 0 < accepted < proposed
