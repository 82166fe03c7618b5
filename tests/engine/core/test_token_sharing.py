"""Token-granular prefix sharing: a match that ends inside a block copies that block's shared tokens
(copy-on-write) instead of recomputing them. Exact block ids on a tiny pool, then the engine: the
same tokens as transformers, and computed prompt tokens at the distinct trie size."""

from __future__ import annotations

import random

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.request import Request
from prefixflow.engine.sampling.sampling_params import SamplingParams as Params
from tests.engine.hf_models import hf_greedy


def make(index: int, tokens: list[int]) -> Request:
    return Request(index, str(index), tokens, Params(), max_tokens=4, seed=0)


def compute_all(kv: KVCacheManager, req: Request) -> None:
    prefix = kv.cached_prefix(req)
    assert kv.admit(req, prefix, req.num_tokens - prefix.tokens(kv.block_size))
    req.num_computed_tokens = req.num_tokens
    kv.commit_computed(req)


def test_a_match_ending_inside_a_full_block_copies_its_shared_tokens():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = make(0, list(range(10)))
    compute_all(kv, a)
    assert kv.take_copies().local == []
    b = make(1, [0, 1, 2, 3, 4, 5, 99, 98, 97])
    prefix = kv.cached_prefix(b)
    assert [blk.block_id for blk in prefix.blocks] == [0]
    assert (prefix.partial_block, prefix.partial_tokens, prefix.tokens(4)) == (1, 2, 6)
    assert kv.admit(b, prefix, 3)
    assert kv.block_table(b) == [0, 3, 4]
    assert kv.take_copies().local == [(1, 3)]  # a's block 1 into b's own block 3, then b writes slot 2 on


def test_the_partial_last_block_of_a_finished_request_stays_shareable():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    a = make(0, list(range(10)))  # its block 2 holds tokens 8, 9 only
    compute_all(kv, a)
    kv.free(a)
    c = make(1, list(range(10)) + [50])
    prefix = kv.cached_prefix(c)
    assert (prefix.partial_block, prefix.partial_tokens, prefix.tokens(4)) == (2, 2, 10)
    assert kv.admit(c, prefix, 1)
    # nobody holds block 2 any more: c continues in it, without a copy
    assert kv.block_table(c) == [0, 1, 2] and kv.pool.blocks[2].ref_count == 1
    assert kv.take_copies().local == []


def test_the_last_prompt_token_is_never_covered():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    compute_all(kv, make(0, list(range(10))))
    same = make(1, list(range(10)))
    assert kv.cached_prefix(same).tokens(4) == 9


def test_block_granular_when_switched_off():
    kv = KVCacheManager(num_blocks=8, block_size=4)
    kv.share_partial_blocks = False
    compute_all(kv, make(0, list(range(10))))
    prefix = kv.cached_prefix(make(1, list(range(10)) + [7]))
    assert prefix.partial_block is None and prefix.tokens(4) == 8


def trie_tokens(rows: list[list[int]]) -> int:
    return len({tuple(r[: i + 1]) for r in rows for i in range(len(r))})


def test_engine_computes_the_distinct_trie_tokens_and_the_same_tokens(llama_dir):
    rng = random.Random(5)
    stems = [[rng.randrange(3, 500) for _ in range(rng.randrange(21, 30))] for _ in range(3)]  # end mid-block
    rows = [s + [rng.randrange(3, 500) for _ in range(rng.randrange(2, 9))] for s in stems for _ in range(5)]
    rows += [rows[0][: len(stems[0]) + 1]]  # one prompt that ends one token into its group's tails
    rng.shuffle(rows)
    params = SamplingParams(max_tokens=4, ignore_eos=True)
    outs = {}
    computed = {}
    for share in (False, True):
        llm = LLM(str(llama_dir), dtype="float32", device="cpu", block_size=8)
        llm.engine.kv.share_partial_blocks = share
        outs[share] = [list(o.token_ids) for o in llm.generate(rows, params)]
        computed[share] = llm.stats().computed_prompt_tokens
    distinct = trie_tokens(rows)
    assert outs[True] == outs[False] == hf_greedy(llama_dir, rows, params.max_tokens)
    # every trie node once, plus at most each prompt's last token (always computed)
    assert distinct <= computed[True] <= distinct + len(rows)
    assert computed[False] > distinct + len(rows)  # block-granular sharing recomputes the partial blocks
