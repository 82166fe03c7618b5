"""Quality of label predictions: accuracy, macro-F1, the largest label's share, calibration error."""

from __future__ import annotations

from collections.abc import Sequence


def label_metrics(gold: Sequence[int], probs: Sequence[Sequence[float]], num_labels: int) -> dict:
    """``gold`` label indices and each row's label distribution -> accuracy, macro-F1 (over all labels,
    a never-predicted label scores 0), largest_share (of predictions), ECE and predicted counts."""
    pred = [max(range(num_labels), key=lambda k: p[k]) for p in probs]
    n = len(gold)
    f1s = []
    for k in range(num_labels):
        tp = sum(p == k and g == k for p, g in zip(pred, gold))
        fp = sum(p == k and g != k for p, g in zip(pred, gold))
        fn = sum(p != k and g == k for p, g in zip(pred, gold))
        f1s.append(2 * tp / (2 * tp + fp + fn) if tp else 0.0)
    counts = [pred.count(k) for k in range(num_labels)]
    return {
        "n": n,
        "accuracy": sum(p == g for p, g in zip(pred, gold)) / n,
        "macro_f1": sum(f1s) / num_labels,
        "largest_share": max(counts) / n,
        "ece": expected_calibration_error([max(p) for p in probs], [p == g for p, g in zip(pred, gold)]),
        "predicted": counts,
    }


def expected_calibration_error(confidence: Sequence[float], correct: Sequence[bool], bins: int = 10) -> float:
    """ECE over equal-width confidence bins: sum over bins of (share of rows) x |accuracy - mean confidence|."""
    groups: list[list[tuple[float, bool]]] = [[] for _ in range(bins)]
    for c, ok in zip(confidence, correct):
        groups[min(int(c * bins), bins - 1)].append((c, ok))
    n = len(confidence)
    return sum(
        len(g) / n * abs(sum(ok for _, ok in g) / len(g) - sum(c for c, _ in g) / len(g)) for g in groups if g
    )
