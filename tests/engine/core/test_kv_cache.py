"""Block pool and prefix cache: exact block ids, hits and eviction order on a tiny pool."""

from __future__ import annotations

from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.request import Request
from prefixflow.engine.sampling.sampling_params import SamplingParams


def make(index: int, tokens: list[int]) -> Request:
    return Request(index, str(index), tokens, SamplingParams(), max_tokens=4, seed=0)


def compute_all(kv: KVCacheManager, req: Request) -> None:
    prefix = kv.cached_prefix(req)
    assert kv.admit(req, prefix, req.num_tokens - len(prefix) * kv.block_size)
    req.num_computed_tokens = req.num_tokens
    kv.commit_computed(req)


def test_allocation_hits_and_lru_eviction_order():
    kv = KVCacheManager(num_blocks=12, block_size=16)
    a = make(0, list(range(40)))  # 2 full blocks + 8 tokens
    compute_all(kv, a)
    assert kv.block_table(a) == [0, 1, 2]
    assert kv.pool.num_free == 9

    b = make(1, list(range(32)) + [999] * 10)  # shares a's two full blocks
    prefix = kv.cached_prefix(b)
    assert [h.block_id for h in prefix.blocks] == [0, 1]
    assert kv.admit(b, prefix, 10)
    assert kv.block_table(b) == [0, 1, 3] and len(prefix) * kv.block_size == 32
    assert kv.pool.blocks[0].ref_count == 2

    kv.free(a)
    kv.free(b)
    # unhashed tail blocks are reused first, then hashed blocks in LRU order (tails before prefixes)
    assert list(kv.pool.free)[:2] == [3, 2]
    assert set(kv.pool.free) == set(range(12))

    c = make(2, list(range(33)))  # hit covers blocks 0,1 (the last token is never covered)
    assert [h.block_id for h in kv.cached_prefix(c).blocks] == [0, 1]

    exact = make(3, list(range(32)))  # 32 tokens: the hit must stop before the last token
    assert [h.block_id for h in kv.cached_prefix(exact).blocks] == [0]


def test_evicted_block_is_no_longer_found():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = make(0, list(range(9)))
    compute_all(kv, a)
    kv.free(a)
    for _ in range(4):  # take every block: hashed ones get evicted
        kv.pool.allocate()
    assert kv.pool.evictions == 2
    assert kv.cached_prefix(make(1, list(range(9)))).blocks == []


def test_collision_guard_compares_token_ids():
    kv = KVCacheManager(num_blocks=4, block_size=4)
    a = make(0, [1, 2, 3, 4, 5])
    compute_all(kv, a)
    block = kv.pool.blocks[kv.block_table(a)[0]]
    block.key = (None, (9, 9, 9, 9))  # pretend another content hashed to the same value
    assert kv.cached_prefix(make(1, [1, 2, 3, 4, 5])).blocks == []


def test_caching_disabled_never_hits():
    kv = KVCacheManager(num_blocks=8, block_size=4, enable_caching=False)
    a = make(0, list(range(9)))
    compute_all(kv, a)
    assert kv.cached_prefix(make(1, list(range(9)))).blocks == []


def test_prefix_hashes_are_the_same_in_every_process():
    import os
    import subprocess
    import sys

    from prefixflow.engine.core.block_pool import chain_hash

    code = "from prefixflow.engine.core.block_pool import chain_hash; print(chain_hash(chain_hash(None, [1, 2, 3]), [4, 5]))"
    seen = set()
    for seed in ("0", "1", "12345"):  # string hashing is salted per process; ours must not be
        env = {**os.environ, "PYTHONHASHSEED": seed}
        seen.add(
            subprocess.run(
                [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
            ).stdout.strip()
        )
    assert seen == {str(chain_hash(chain_hash(None, [1, 2, 3]), [4, 5]))}
