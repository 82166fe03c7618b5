"""The host KV tier: exact block ids of offloads and reloads on a tiny pool, the cost model's
choice, pinning, and a random admission/eviction/preemption walk whose block contents are checked
byte for byte after every copy."""

from __future__ import annotations

import random

import torch

from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.request import Request
from prefixflow.engine.kv_offload.copy_plan import CopyPlan
from prefixflow.engine.kv_offload.cost_model import CostModel
from prefixflow.engine.kv_offload.host_store import HostKVStore
from tests.engine.core.test_kv_cache import compute_all, make


def test_evicted_blocks_go_to_the_host_and_come_back_by_hash():
    kv = KVCacheManager(num_blocks=4, block_size=4, host_blocks=4)
    a = make(0, list(range(9)))  # blocks 0, 1 full and hashed, 2 partial
    compute_all(kv, a)
    kv.free(a)  # free queue: 2 (unhashed, first), 3, then 1, 0 (suffix before prefix)
    b = make(1, list(range(100, 116)))
    compute_all(kv, b)  # takes all four blocks: evicts 1, then 0
    plan = kv.take_copies()
    assert plan.offload == [(1, 0), (0, 1)] and plan.reload == []
    assert kv.pool.evictions == 2
    kv.free(b)

    c = make(2, list(range(9)))
    prefix = kv.cached_prefix(c)
    assert prefix.num_device == 0 and [h.host_id for h in prefix.host] == [1, 0] and len(prefix) == 2
    assert kv.admit(c, prefix, 1)
    plan = kv.take_copies()
    table = kv.block_table(c)
    assert plan.reload == [(1, table[0]), (0, table[1])]
    # b (table [2, 3, 1, 0]) made room suffix first: device 0 went to host 2, device 1 to host 3, and
    # device 3 to host 2 again (the host's oldest block), so the first copy into host 2 was dropped
    assert plan.offload == [(1, 3), (3, 2)]
    assert kv.host is not None and kv.host.counters.reloaded_blocks == 2
    # the reloaded blocks are device-cached again: a fourth request hits them on the device
    d = make(3, list(range(9)))
    assert [blk.block_id for blk in kv.cached_prefix(d).blocks] == table[:2]


def test_a_block_the_host_already_holds_is_not_copied_again():
    kv = KVCacheManager(num_blocks=3, block_size=4, host_blocks=4)
    a = make(0, list(range(8)))
    compute_all(kv, a)
    kv.free(a)
    compute_all(kv, b := make(1, list(range(50, 62))))  # evicts a's two blocks
    assert len(kv.take_copies().offload) == 2
    kv.free(b)
    compute_all(kv, c := make(2, list(range(8))))  # reloads block 0 (the last token is computed)
    assert len(kv.take_copies().reload) == 1
    kv.free(c)
    evictions = kv.pool.evictions
    # d evicts device 2 (b's first block), 1 (a's second, recomputed by c) and 0 (a's first, which c
    # reloaded from the host and the host still holds): three evictions, two copies
    compute_all(kv, make(3, list(range(80, 92))))
    assert kv.pool.evictions - evictions == 3
    assert [dev for dev, _ in kv.take_copies().offload] == [2, 1]


def test_cost_model_recomputes_a_short_run_and_reloads_a_long_one():
    slow_link = CostModel(1e6, 1e3, 0.0, 1e12, 1e10, reload_latency_s=1e-3)  # 1 ms per reload
    assert not slow_link.reload_cheaper(0, 16)  # 16 us of compute: recompute
    assert slow_link.reload_cheaper(0, 4096)  # 4.1 ms of compute against 1 ms + 0.4 ms of copy
    kv = KVCacheManager(num_blocks=4, block_size=4, host_blocks=4, cost=slow_link)
    a = make(0, list(range(9)))
    compute_all(kv, a)
    kv.free(a)
    compute_all(kv, b := make(1, list(range(100, 116))))
    assert len(kv.take_copies().offload) == 2
    kv.free(b)
    prefix = kv.cached_prefix(make(2, list(range(9))))
    assert prefix.host == [] and kv.host is not None and kv.host.counters.declined_blocks == 2


def test_pinned_host_blocks_survive_offloads_in_the_same_step():
    kv = KVCacheManager(num_blocks=3, block_size=4, host_blocks=1)
    a = make(0, list(range(5)))  # one full block
    compute_all(kv, a)
    kv.free(a)
    compute_all(kv, b := make(1, list(range(50, 62))))  # evicts a's block into host block 0
    assert kv.take_copies().offload == [(0, 0)]
    # b's blocks are hashed and free; c's host hit is pinned while its own allocation evicts b's
    kv.free(b)
    c = make(2, list(range(5)) + list(range(70, 77)))
    prefix = kv.cached_prefix(c)
    assert [h.host_id for h in prefix.host] == [0]
    assert kv.admit(c, prefix, 8)
    plan = kv.take_copies()
    assert plan.offload == []  # the only host block is pinned by c's reload: b's blocks are dropped
    assert plan.reload == [(0, kv.block_table(c)[0])]


def test_copy_plan_round_trips_through_its_tensor():
    plan = CopyPlan([(1, 2), (3, 4)], [(5, 6)], [(7, 8), (9, 10), (11, 12)])
    assert CopyPlan.unpack(plan.pack()) == plan
    assert not CopyPlan() and CopyPlan.unpack(CopyPlan().pack()) == CopyPlan()


# -- the random walk ----------------------------------------------------------------------------------
BS = 4
LAYERS, HEADS, DIM = 2, 1, 2


def slot_value(tokens: list[int], pos: int) -> float:
    """What the KV of position ``pos`` must hold: a function of the tokens up to it, as in a model."""
    return float(hash(tuple(tokens[: pos + 1])) % 100_003)


def write(cache: torch.Tensor, table: list[int], tokens: list[int], start: int, stop: int) -> None:
    for pos in range(start, stop):
        block, off = table[pos // BS], pos % BS
        cache[:, 0, block, off] = slot_value(tokens, pos)
        cache[:, 1, block, off] = -slot_value(tokens, pos)


def check(cache: torch.Tensor, table: list[int], tokens: list[int], upto: int) -> None:
    for pos in range(upto):
        block, off = table[pos // BS], pos % BS
        want = slot_value(tokens, pos)
        assert torch.all(cache[:, 0, block, off] == want) and torch.all(cache[:, 1, block, off] == -want), (
            f"position {pos} in block {block} holds the wrong KV"
        )


def random_walk(seed: int) -> tuple[int, int]:
    """One random run; returns (offloaded, reloaded) block copies. Asserts as it goes."""
    rng = random.Random(seed)
    num_blocks, host_blocks = rng.randrange(6, 14), rng.randrange(1, 10)
    kv = KVCacheManager(num_blocks, BS, host_blocks=host_blocks, reserve_output_blocks=1)
    assert kv.host is not None
    cache = torch.zeros((LAYERS, 2, num_blocks, BS, HEADS, DIM))
    store = HostKVStore(cache, host_blocks)
    stems = [[rng.randrange(5) for _ in range(rng.randrange(1, 12))] for _ in range(4)]
    waiting = [
        make(i, rng.choice(stems) + [rng.randrange(5) for _ in range(rng.randrange(1, 8))]) for i in range(30)
    ]
    running: list[Request] = []
    chains: dict[int, list[int]] = {}  # block hash -> the tokens up to the end of that block
    offloaded = reloaded = 0

    def apply() -> None:
        nonlocal offloaded, reloaded
        plan = kv.take_copies()
        offloaded, reloaded = offloaded + len(plan.offload), reloaded + len(plan.reload)
        store.apply(plan)

    def commit(req: Request) -> None:
        kv.commit_computed(req)
        table = kv._tables[req.key]
        for i, h in enumerate(table.block_hashes):
            chains.setdefault(h, req.token_ids[: (i + 1) * BS])

    for _ in range(300):
        if not waiting and not running:
            break
        op = rng.random()
        if waiting and (op < 0.5 or not running):
            req = waiting.pop(0)
            prefix = kv.cached_prefix(req)
            cached = prefix.tokens(BS)
            n = rng.randrange(1, req.num_tokens - cached + 1)
            if kv.admit(req, prefix, n):
                apply()
                # device hits and reloads hold the prefix
                check(cache, kv.block_table(req), req.token_ids, cached)
                write(cache, kv.block_table(req), req.token_ids, cached, cached + n)
                req.num_computed_tokens = cached + n
                commit(req)
                running.append(req)
            else:
                assert not kv.take_copies()  # a refused admission plans nothing
                waiting.insert(0, req)
                victim = running.pop()  # preempt the newest to make room
                kv.free(victim)
                victim.reset_computed()
                waiting.insert(0, victim)
        elif op < 0.8:
            req = rng.choice(running)
            if req.num_computed_tokens == req.num_tokens:
                req.token_ids.append(rng.randrange(5))  # a sampled token
            if kv.can_append(req, 1):
                kv.append(req, 1)
                apply()
                write(
                    cache,
                    kv.block_table(req),
                    req.token_ids,
                    req.num_computed_tokens,
                    req.num_computed_tokens + 1,
                )
                req.num_computed_tokens += 1
                commit(req)
        else:
            req = running.pop(rng.randrange(len(running)))
            check(cache, kv.block_table(req), req.token_ids, req.num_computed_tokens)
            kv.free(req)
        # reference counts equal the tables that hold each block; free blocks have none; no host block
        # stays pinned past its step and none is lost from the host LRU
        holders = [b for r in running for b in kv.block_table(r)]
        for block in kv.pool.blocks:
            assert block.ref_count == holders.count(block.block_id)
            assert (block.ref_count == 0) == (block.block_id in kv.pool.free)
        assert all(h.pins == 0 for h in kv.host.pool.blocks) and len(kv.host.pool.lru) == host_blocks
        # every host block's bytes are the KV of the tokens its hash stands for
        for hb in kv.host.pool.blocks:
            if hb.block_hash is not None:
                tokens = chains[hb.block_hash]
                for off in range(BS):
                    want = slot_value(tokens, len(tokens) - BS + off)
                    assert torch.all(store.host[hb.host_id, :, 0, off] == want)
                    assert torch.all(store.host[hb.host_id, :, 1, off] == -want)
    for req in running:
        check(cache, kv.block_table(req), req.token_ids, req.num_computed_tokens)
        kv.free(req)
    assert kv.pool.num_free == num_blocks and not kv.pool.cached.keys() - set(chains)
    return offloaded, reloaded


def test_random_admission_eviction_preemption_keeps_blocks_and_contents_consistent():
    totals = [random_walk(seed) for seed in range(16)]
    assert sum(o for o, _ in totals) > 0 and sum(r for _, r in totals) > 0  # both kinds of copy happened


def test_shard_command_ids_are_distinct():
    # regression: a merge once gave KV_COPY the id of PIPELINE_STATS, so TP workers never copied blocks
    from prefixflow.engine.runner import model_shard

    ids = [v for k, v in vars(model_shard).items() if k.isupper() and k not in ("CPU_DEFAULT_KV_BYTES",)]
    assert len(ids) == len(set(ids)), ids
