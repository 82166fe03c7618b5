"""Deal shards to engine lanes: prefix affinity first, token balance second."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class _Described(Protocol):
    prefix_key: str
    est_tokens: int


T = TypeVar("T", bound=_Described)


def deal_shards(infos: Sequence[T], lanes: int) -> list[list[T]]:
    """Split shards into at most `lanes` contiguous runs of the prefix-sorted order.

    Sorting by `prefix_key` puts shards whose rows share long prompt prefixes next to each
    other, so cutting the sorted list into contiguous runs keeps them in one lane (one engine,
    one prefix cache). Cuts are placed where the running token total is closest to the ideal
    `k * total / lanes` boundary, so lanes stay balanced in estimated tokens. Every returned
    lane holds at least one shard; fewer lanes come back when there are fewer shards.
    """
    if lanes < 1:
        raise ValueError(f"lanes must be >= 1, got {lanes}")
    ordered = sorted(infos, key=lambda info: info.prefix_key)
    n = len(ordered)
    lanes = min(lanes, n)
    if lanes == 0:
        return []
    weights = [max(1, int(info.est_tokens)) for info in ordered]
    prefix = [0]
    for w in weights:
        prefix.append(prefix[-1] + w)
    total = prefix[-1]

    cuts = [0]
    for k in range(1, lanes):
        target = total * k / lanes
        lo = cuts[-1] + 1  # this lane gets at least one shard
        hi = n - (lanes - k)  # leave one shard for each lane still to come
        best = min(range(lo, hi + 1), key=lambda i: (abs(prefix[i] - target), i))
        cuts.append(best)
    cuts.append(n)
    return [ordered[a:b] for a, b in zip(cuts, cuts[1:])]
