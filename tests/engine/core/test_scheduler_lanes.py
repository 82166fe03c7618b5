"""Property test of the scheduler's lanes (pipeline parallelism's virtual engines): steps of several
lanes in flight at once over one block pool never share a request, leak, double-free or stall, and the
KV every request reads is what it holds. The model stands in as the pipeline does: a step's KV is
written when it starts (each stage runs steps in start order), its tokens come back when it finishes,
one or more starts later."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.request import Request, Status
from prefixflow.engine.core.scheduler import Scheduler, SchedulerLimits
from prefixflow.engine.core.step_types import ModelOutput, SchedulerOutput
from prefixflow.engine.sampling.sampling_params import SamplingParams
from prefixflow.engine.sampling.stop_checker import StopChecker
from tests.engine.core.test_scheduler_properties import apply_copies, check_invariants


def simulate_lanes(seed: int, lanes: int, num_blocks: int, block_size: int, budget: int, max_seqs: int):
    rng = random.Random(seed)
    kv = KVCacheManager(num_blocks, block_size, True)
    no_stops = StopChecker(tokenizer=None, eos_ids=(), max_model_len=10**9)
    sched = Scheduler(SchedulerLimits(max_seqs, budget), kv, no_stops, lanes=lanes)
    capacity = num_blocks * block_size
    prefixes = [[rng.randrange(50) for _ in range(rng.randrange(0, 12))] for _ in range(3)]
    pending = []
    for i in range(rng.randrange(2, 14)):
        prompt = rng.choice(prefixes) + [rng.randrange(50) for _ in range(rng.randrange(1, 10))]
        max_tokens = rng.randrange(1, 40)
        if len(prompt) + max_tokens - 1 <= capacity:
            pending.append(Request(i, str(i), prompt, SamplingParams(), max_tokens, seed=i))
    total, finished, shadow = len(pending), 0, {}
    in_flight: list[tuple[int, SchedulerOutput]] = []
    for _ in range(20000):
        while pending and rng.random() < 0.5:
            sched.add(pending.pop(0))
        busy = {lane for lane, _ in in_flight}
        for lane in range(lanes):  # start a step for every idle lane (lanes.py's fill)
            if lane in busy or not sched.lane_has_work(lane):
                continue
            step = sched.schedule(lane)
            if not step:
                continue
            flying = {c.request.key for _, s in in_flight for c in s}
            assert not flying & {c.request.key for c in step}, "a request in two steps in flight"
            assert all(c.request.lane == lane for c in step)
            apply_copies(kv.take_copies(), shadow, block_size)
            for chunk in step:  # the stages write this step's KV after every step started before it
                req = chunk.request
                for pos in range(req.num_computed_tokens, req.num_computed_tokens + chunk.num_tokens):
                    slot = chunk.block_table[pos // block_size] * block_size + pos % block_size
                    shadow[slot] = req.token_ids[pos]
            in_flight.append((lane, step))
        if not in_flight:
            if not sched.has_work() and not pending:
                break
            assert not sched.has_work(), "no progress"
            continue
        _, step = in_flight.pop(0)  # the oldest step's logits arrive
        model = ModelOutput()
        for chunk in step:
            req = chunk.request
            if req.num_computed_tokens + chunk.num_tokens == req.num_tokens:
                model.sampled[req.key] = rng.randrange(50)
        done = sched.update_from_output(step, model)
        assert all(r.status is Status.FINISHED and r.num_output_tokens == r.max_tokens for r in done)
        finished += len(done)
        check_invariants(kv, sched, shadow)
    assert finished == total
    assert kv.pool.num_free == num_blocks and all(b.ref_count == 0 for b in kv.pool.blocks)
    return sched


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 10**6),
    lanes=st.integers(2, 3),
    num_blocks=st.integers(8, 40),
    block_size=st.sampled_from([2, 4]),
    budget=st.integers(1, 48),
    max_seqs=st.integers(1, 8),
)
def test_lanes_in_flight_never_leak_share_or_stall(seed, lanes, num_blocks, block_size, budget, max_seqs):
    simulate_lanes(seed, lanes, num_blocks, block_size, budget, max_seqs)


def test_lanes_split_the_running_requests_and_the_simulation_preempts():
    preemptions = 0
    for seed in range(20):
        sched = simulate_lanes(seed, 2, num_blocks=12, block_size=4, budget=16, max_seqs=6)
        preemptions += sched.num_preemptions
    assert preemptions > 0
    kv = KVCacheManager(64, 4, True)
    sched = Scheduler(SchedulerLimits(4, 64), kv, StopChecker(None, (), 10**9), lanes=2)
    for i in range(5):
        sched.add(Request(i, str(i), [i + 1] * 6, SamplingParams(), 3, seed=i))
    first, second = sched.schedule(0), sched.schedule(1)
    assert [c.request.index for c in first] == [0, 1] and [c.request.index for c in second] == [2, 3]
    assert len(sched.waiting) == 1  # ceil(4 / 2) per lane: max_num_seqs over all lanes
    assert [r.lane for r in sched.running] == [0, 0, 1, 1] and sched.num_unfinished() == 5
