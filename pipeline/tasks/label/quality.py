"""Label quality a run can report about itself: the label distribution before and after calibration,
and, with ``label.gold_column``, accuracy, macro-F1, a confusion matrix and the expected calibration
error (ECE) against the true labels.

Every number is built from counts that add up over part files (``part_quality``), so each commit
marker carries its shard's counts and the summary adds the markers up, exactly like the row and token
totals: nothing is re-read from the data files, and a resumed run reports the same figures.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

ECE_BINS = 10  # equal-width confidence bins, as benchmarks/label_metrics.py


def gold_text(value: Any) -> str | None:
    """The gold column's cell as the label text it is compared with (None stays None)."""
    if value is None:
        return None
    text = str(value).strip()
    return text or None


def _argmax(scores: Mapping[str, float]) -> tuple[str, float]:
    label = max(scores, key=lambda lb: scores[lb])
    top = max(scores.values())
    total = sum(math.exp(v - top) for v in scores.values())
    return label, 1.0 / total  # the softmax probability of the best label


def _ece_bin(confidence: float) -> int:
    return min(int(confidence * ECE_BINS), ECE_BINS - 1)


def part_quality(
    job_labels: Sequence[str],
    labels: Sequence[Any],
    probs: Sequence[Any] | None,
    raw: Sequence[Any] | None,
    gold: Sequence[Any] | None,
) -> dict[str, Any]:
    """Additive counts of one part's rows (the ``label``, ``label_probs``, ``label_logprobs_raw`` and
    ``label_gold`` columns; error rows have null labels and count nowhere). Keys:
    ``raw_counts`` (the label each row would have had before calibration); with gold, per scoring
    (``calibrated``, ``raw``): ``confusion`` {gold: {predicted: n}} and ``ece`` bins of
    [rows, summed confidence, correct rows]; ``gold_unknown``: gold cells that are no label of the job."""
    out: dict[str, Any] = {}
    raw_counts: dict[str, int] = {}
    scored: dict[str, dict[str, Any]] = {}
    unknown = 0
    for i, label in enumerate(labels):
        if label is None:
            continue
        raw_pred: tuple[str, float] | None = None
        if raw is not None and raw[i] is not None:
            raw_pred = _argmax(raw[i])
            raw_counts[raw_pred[0]] = raw_counts.get(raw_pred[0], 0) + 1
        truth = gold[i] if gold is not None else None
        if truth is None:
            continue
        if truth not in job_labels:
            unknown += 1
            continue
        p = probs[i] if probs is not None else None
        confidence = max(p.values()) if p else None  # generate/constrained rows have no probabilities
        calibrated = (label, confidence)
        for name, pred in (("calibrated", calibrated), ("raw", raw_pred)):
            if pred is None:
                continue
            s = scored.setdefault(name, {"confusion": {}, "ece": [[0, 0.0, 0] for _ in range(ECE_BINS)]})
            row = s["confusion"].setdefault(truth, {})
            row[pred[0]] = row.get(pred[0], 0) + 1
            if pred[1] is None:
                continue
            b = s["ece"][_ece_bin(pred[1])]
            b[0] += 1
            b[1] += pred[1]
            b[2] += int(pred[0] == truth)
    if raw_counts:
        out["raw_counts"] = dict(sorted(raw_counts.items()))
    out.update(scored)
    if unknown:
        out["gold_unknown"] = unknown
    return out


def merge_quality(parts: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The sum of several ``part_quality`` results."""
    out: dict[str, Any] = {}
    for q in parts:
        for key, value in q.items():
            if key == "raw_counts":
                counts = out.setdefault(key, {})
                for lb, n in value.items():
                    counts[lb] = counts.get(lb, 0) + n
            elif key == "gold_unknown":
                out[key] = out.get(key, 0) + value
            else:
                s = out.setdefault(key, {"confusion": {}, "ece": [[0, 0.0, 0] for _ in range(ECE_BINS)]})
                for truth, row in value["confusion"].items():
                    mine = s["confusion"].setdefault(truth, {})
                    for pred, n in row.items():
                        mine[pred] = mine.get(pred, 0) + n
                for b, (n, conf, ok) in zip(s["ece"], value["ece"]):
                    b[0] += n
                    b[1] += conf
                    b[2] += ok
    if "raw_counts" in out:
        out["raw_counts"] = dict(sorted(out["raw_counts"].items()))
    return out


def metrics(
    confusion: Mapping[str, Mapping[str, int]], ece_bins: Sequence[Sequence[float]], labels: Sequence[str]
) -> dict[str, Any]:
    """Accuracy, macro-F1 (over every listed label; a label never predicted nor true is left out,
    one never predicted scores 0), ECE (None without probabilities), and the confusion matrix as rows of counts in label order."""
    n = sum(sum(row.values()) for row in confusion.values())
    correct = sum(confusion.get(lb, {}).get(lb, 0) for lb in labels)
    f1s = []
    for lb in labels:
        tp = confusion.get(lb, {}).get(lb, 0)
        fp = sum(row.get(lb, 0) for truth, row in confusion.items() if truth != lb)
        fn = sum(v for pred, v in confusion.get(lb, {}).items() if pred != lb)
        if tp + fp + fn:
            f1s.append(2 * tp / (2 * tp + fp + fn))
    binned = sum(b[0] for b in ece_bins)
    ece = sum(b[0] / binned * abs(b[2] / b[0] - b[1] / b[0]) for b in ece_bins if b[0]) if binned else None
    return {
        "rows": n,
        "accuracy": correct / n if n else 0.0,
        "macro_f1": sum(f1s) / len(f1s) if f1s else 0.0,
        "ece": ece,
        "confusion": [[confusion.get(t, {}).get(p, 0) for p in labels] for t in labels],
    }


def quality_report(merged: Mapping[str, Any], labels: Sequence[str]) -> dict[str, Any]:
    """The summary's ``label_quality``: metrics after (``calibrated``) and before (``raw``) calibration
    against the gold column; empty without gold labels."""
    out: dict[str, Any] = {}
    for name in ("calibrated", "raw"):
        if name in merged:
            out[name] = metrics(merged[name]["confusion"], merged[name]["ece"], labels)
    if out:
        out["labels"] = list(labels)
        out["gold_unknown"] = int(merged.get("gold_unknown", 0))
    return out
