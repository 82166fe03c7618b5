"""Prefix-affine, token-balanced dealing of shards to lanes (pure logic, no Prefect)."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest

from prefixflow.flows.dealing import deal_shards


@dataclass(frozen=True)
class Info:
    name: str
    prefix_key: str
    est_tokens: int


def _infos(spec: list[tuple[str, int]]) -> list[Info]:
    return [Info(f"s{i}", key, tokens) for i, (key, tokens) in enumerate(spec)]


def test_every_shard_dealt_once_in_prefix_order() -> None:
    rng = random.Random(0)
    infos = _infos([(rng.choice("abcdef") * 3, rng.randint(1, 500)) for _ in range(57)])
    lanes = deal_shards(infos, 4)
    flat = [i for lane in lanes for i in lane]
    assert sorted(i.name for i in flat) == sorted(i.name for i in infos)
    assert [i.prefix_key for i in flat] == sorted(i.prefix_key for i in infos)
    assert len(lanes) == 4 and all(lanes)


def test_same_prefix_stays_in_one_lane_when_balance_allows() -> None:
    infos = _infos([("zz", 100)] * 3 + [("aa", 100)] * 3)
    lanes = deal_shards(infos, 2)
    assert [{i.prefix_key for i in lane} for lane in lanes] == [{"aa"}, {"zz"}]


def test_lanes_balanced_in_tokens() -> None:
    rng = random.Random(1)
    infos = _infos([(f"{k:03d}", rng.randint(50, 150)) for k in range(200)])
    lanes = deal_shards(infos, 5)
    loads = [sum(i.est_tokens for i in lane) for lane in lanes]
    ideal = sum(loads) / 5
    assert max(abs(load - ideal) for load in loads) <= 150


def test_heavy_shard_gets_its_own_lane() -> None:
    infos = _infos([("a", 10), ("b", 1000), ("c", 10), ("d", 10)])
    lanes = deal_shards(infos, 3)
    assert [i.prefix_key for i in lanes[1]] == ["b"]


def test_fewer_shards_than_lanes_and_empty() -> None:
    infos = _infos([("a", 5), ("b", 5)])
    assert [len(lane) for lane in deal_shards(infos, 8)] == [1, 1]
    assert deal_shards([], 3) == []
    with pytest.raises(ValueError):
        deal_shards(infos, 0)
