"""Property test: random arrivals, shared prefixes, pool sizes and budgets never leak, double-free,
share a block wrongly, or stall; every request finishes. The scheduler is driven through its real
step interface (``schedule`` then ``update_from_output``) with random tokens standing in for the model."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.request import Request, Status
from prefixflow.engine.core.scheduler import Scheduler, SchedulerLimits
from prefixflow.engine.core.step_types import ModelOutput
from prefixflow.engine.sampling.sampling_params import SamplingParams
from prefixflow.engine.sampling.stop_checker import StopChecker


def check_invariants(kv: KVCacheManager, sched: Scheduler, shadow: dict[int, int]) -> None:
    owners: dict[int, int] = {}
    for req in sched.running:
        table = kv.block_table(req)
        assert len(set(table)) == len(table)
        for pos in range(req.num_computed_tokens):  # what the cache holds is what the request holds
            slot = table[pos // kv.block_size] * kv.block_size + pos % kv.block_size
            assert shadow.get(slot) == req.token_ids[pos]
        for b in table:
            owners[b] = owners.get(b, 0) + 1
    for block in kv.pool.blocks:
        assert block.ref_count == owners.get(block.block_id, 0)
        assert (block.block_id in kv.pool.free) == (block.ref_count == 0)
    for req in sched.waiting:
        assert kv.block_table(req) == []
    free_cached = sum(1 for b in kv.pool.free if kv.pool.blocks[b].block_hash is not None)
    assert kv.pool.num_free_cached == free_cached


def apply_copies(plan, shadow: dict[int, int], block_size: int) -> None:
    """Partial-block copies (copy-on-write of a shared last block) move whole blocks' slots."""
    assert not plan.offload and not plan.reload  # no host tier here
    for src, dst in plan.local:
        for off in range(block_size):
            value = shadow.get(src * block_size + off)
            if value is None:
                shadow.pop(dst * block_size + off, None)
            else:
                shadow[dst * block_size + off] = value


def simulate(seed: int, num_blocks: int, block_size: int, budget: int, max_seqs: int, caching: bool):
    """Drive the scheduler like the engine does (tokens computed, one sampled token per finished
    chunk), checking the invariants after every step. Outputs of up to 40 tokens outgrow the
    admission reservation, so running requests run out of blocks and get preempted."""
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks, block_size, caching)
    no_stops = StopChecker(tokenizer=None, eos_ids=(), max_model_len=10**9)  # only max_tokens ends one
    sched = Scheduler(SchedulerLimits(max_seqs, budget), kv, no_stops)
    capacity = num_blocks * block_size
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(0, 12))] for _ in range(3)]
    pending = []
    for i in range(rng.randrange(1, 14)):
        prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
        max_tokens = rng.randrange(1, 40)
        if len(prompt) + max_tokens - 1 > capacity:
            continue
        pending.append(Request(i, str(i), prompt, SamplingParams(), max_tokens, seed=i))
    total = len(pending)
    shadow: dict[int, int] = {}
    finished = 0
    for _ in range(20000):
        while pending and rng.random() < 0.5:
            sched.add(pending.pop(0))
        if not sched.has_work():
            if not pending:
                break
            continue
        step = sched.schedule()
        assert step, "no progress"
        apply_copies(kv.take_copies(), shadow, block_size)  # as the engine does before the forward pass
        model = ModelOutput()
        for chunk in step:
            req = chunk.request
            for pos in range(req.num_computed_tokens, req.num_computed_tokens + chunk.num_tokens):
                slot = chunk.block_table[pos // block_size] * block_size + pos % block_size
                shadow[slot] = req.token_ids[pos]
            if req.num_computed_tokens + chunk.num_tokens == req.num_tokens:
                model.sampled[req.key] = rng.randrange(50)
        done = sched.update_from_output(step, model)
        assert all(r.status is Status.FINISHED and r.num_output_tokens == r.max_tokens for r in done)
        finished += len(done)
        check_invariants(kv, sched, shadow)
    assert finished == total
    assert kv.pool.num_free == num_blocks and all(b.ref_count == 0 for b in kv.pool.blocks)
    return sched, kv


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    num_blocks=st.integers(6, 40),
    block_size=st.sampled_from([2, 4, 8]),
    budget=st.integers(1, 64),
    max_seqs=st.integers(1, 8),
    caching=st.booleans(),
)
def test_random_workloads_finish_without_leaks(seed, num_blocks, block_size, budget, max_seqs, caching):
    simulate(seed, num_blocks, block_size, budget, max_seqs, caching)


def test_the_simulation_exercises_preemption_and_eviction():
    """The property above is only as good as the paths it reaches: make sure it preempts and evicts."""
    preemptions = evictions = 0
    for seed in range(30):
        sched, kv = simulate(seed, num_blocks=16, block_size=4, budget=16, max_seqs=8, caching=True)
        preemptions += sched.num_preemptions
        evictions += kv.pool.evictions
    assert preemptions > 0 and evictions > 0
