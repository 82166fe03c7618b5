"""Which heads, rows and vocabulary entries each rank owns, and the errors for impossible splits."""

from __future__ import annotations

import pytest

from prefixflow.engine.distributed.sharding import (
    ShardingError,
    attention_shard,
    even_partition,
    tp_layout,
    vocab_shard,
)


def test_even_partition_covers_the_dimension_once():
    parts = [even_partition(12, r, 3, "x") for r in range(3)]
    assert [(p.start, p.end) for p in parts] == [(0, 4), (4, 8), (8, 12)]


def test_gqa_splits_query_and_kv_heads_in_step():
    shards = [attention_shard(32, 8, r, 4) for r in range(4)]
    assert [(s.q_heads.start, s.q_heads.end) for s in shards] == [(0, 8), (8, 16), (16, 24), (24, 32)]
    assert [(s.kv_heads.start, s.kv_heads.end) for s in shards] == [(0, 2), (2, 4), (4, 6), (6, 8)]
    for s in shards:  # each local query head reads a local KV head (group size 4)
        assert all(s.kv_heads.start <= h // 4 < s.kv_heads.end for h in range(s.q_heads.start, s.q_heads.end))
    assert {s.kv_replicas for s in shards} == {1}


def test_mqa_replicates_the_single_kv_head():
    shards = [attention_shard(4, 1, r, 2) for r in range(2)]
    assert [(s.num_heads, s.num_kv_heads, s.kv_heads.start) for s in shards] == [(2, 1, 0), (2, 1, 0)]
    assert shards[0].kv_replicas == 2


def test_few_kv_heads_are_replicated_to_the_ranks_that_read_them():
    shards = [attention_shard(8, 2, r, 4) for r in range(4)]  # 2 KV heads, 4 ranks: 2 copies each
    assert [s.kv_heads.start for s in shards] == [0, 0, 1, 1]
    for s in shards:
        assert all(h // 4 == s.kv_heads.start for h in range(s.q_heads.start, s.q_heads.end))


def test_vocab_is_padded_so_every_rank_holds_the_same_rows():
    shards = [vocab_shard(10, r, 4) for r in range(4)]
    assert [(s.owned.start, s.owned.end) for s in shards] == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert {s.padded_per_rank for s in shards} == {3}
    tiny = [vocab_shard(2, r, 4) for r in range(4)]  # more ranks than tokens: empty shards are fine
    assert [s.owned.size for s in tiny] == [1, 1, 0, 0]


@pytest.mark.parametrize(
    "heads, kv, inter, world, message",
    [
        (
            6,
            6,
            128,
            4,
            r"num_attention_heads \(6\) is not divisible by tensor_parallel_size=4; .*\(1, 2, 3, 6\)",
        ),
        (12, 3, 128, 2, r"num_key_value_heads \(3\) is not divisible by tensor_parallel_size=2"),
        (12, 2, 128, 3, r"num_attention_heads \(12\) .*|num_key_value_heads \(2\) is below"),
        (8, 8, 100, 8, r"intermediate_size \(100\) is not divisible by tensor_parallel_size=8"),
    ],
)
def test_impossible_splits_name_the_dimension(heads, kv, inter, world, message):
    with pytest.raises(ShardingError, match=message):
        tp_layout(heads, kv, inter, 1000, 0, world)


def test_kv_heads_that_neither_divide_nor_replicate_evenly():
    with pytest.raises(ShardingError, match=r"num_key_value_heads \(2\) is below tensor_parallel_size=3"):
        attention_shard(6, 2, 0, 3)


def test_layout_reports_every_problem_at_once():
    with pytest.raises(ShardingError) as err:
        tp_layout(6, 6, 102, 1000, 0, 4)
    assert "num_attention_heads" in str(err.value) and "intermediate_size" in str(err.value)
