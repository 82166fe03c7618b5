"""Speculative-decoding counters in shard markers and the run summary (the engine's, per method)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

SPECULATION_COUNTS = ("proposed", "accepted", "runs")


def sum_speculation(markers: Iterable[Mapping[str, Mapping[str, int]]]) -> dict[str, dict[str, float]]:
    """Per method: the summed counters, the acceptance rate (accepted / proposed) and the mean accepted
    length (drafts accepted per verified run; each run also emits the model's own next token)."""
    totals: dict[str, dict[str, int]] = {}
    for marker in markers:
        for method, counts in marker.items():
            row = totals.setdefault(method, dict.fromkeys(SPECULATION_COUNTS, 0))
            for key in SPECULATION_COUNTS:
                row[key] += int(counts.get(key, 0))
    out: dict[str, dict[str, float]] = {}
    for method, row in sorted(totals.items()):
        out[method] = {
            **row,
            "acceptance_rate": round(row["accepted"] / row["proposed"], 4) if row["proposed"] else 0.0,
            "mean_accepted_length": round(row["accepted"] / row["runs"], 4) if row["runs"] else 0.0,
        }
    return out
