"""benchmarks/eval_labels.py at its smallest on the tiny preset, and its metrics by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks import eval_labels
from benchmarks.label_metrics import expected_calibration_error, label_metrics


def test_label_metrics_hand_counted() -> None:
    gold = [0, 0, 1, 1]
    probs = [[0.9, 0.1], [0.6, 0.4], [0.7, 0.3], [0.2, 0.8]]  # predicted 0, 0, 0, 1
    m = label_metrics(gold, probs, 2)
    assert m["accuracy"] == 0.75 and m["predicted"] == [3, 1] and m["largest_share"] == 0.75
    assert m["macro_f1"] == pytest.approx((0.8 + 2 / 3) / 2)  # F1 0.8 for label 0, 2/3 for label 1
    # bins: 0.9 (right), 0.6 (right), 0.7 (wrong), 0.8 (right): |1-.9| + |1-.6| + |0-.7| + |1-.8|, over 4
    assert m["ece"] == pytest.approx((0.1 + 0.4 + 0.7 + 0.2) / 4)
    assert expected_calibration_error([0.95, 0.95], [True, False]) == pytest.approx(0.45)


def test_eval_labels_smoke(tmp_path: Path) -> None:
    out = tmp_path / "eval.json"
    eval_labels.main(
        [
            "--model",
            "tiny",
            "--limit",
            "8",
            "--sets",
            "tickets",
            "--threads",
            "1",
            "--pipeline",
            "--json",
            str(out),
        ]
    )
    result = json.loads(out.read_text())
    styles = result["sets"]["tickets"]
    assert set(styles) == {s.name for s in eval_labels.SETS[0].styles}
    default = eval_labels.DEFAULT_METHOD
    assert {"raw (before issue 14)", default, "permutation average + case"} <= set(styles["chat"]["methods"])
    for res in styles.values():
        applied = res["pipeline_default"]["calibration"]["applied"]  # 8 rows < 8 x 4 labels: contextual
        assert (
            applied == "contextual"
            and "fewer than 8 x 4 labels" in res["pipeline_default"]["calibration"]["fallback"]
        )
        default = eval_labels.METHOD_OF[applied]
        for m in res["methods"].values():
            assert m["n"] == 8 and 0 <= m["accuracy"] <= 1 and sum(m["predicted"]) == 8
        # the pipeline's default job end to end equals the offline evaluation of the default method
        assert res["pipeline_default"]["predicted"] == res["methods"][default]["predicted"]
        assert res["pipeline_default"]["ece"] == pytest.approx(res["methods"][default]["ece"], abs=1e-6)


def test_eval_labels_demo_smoke(tmp_path: Path) -> None:
    from benchmarks import eval_labels_demo

    out = tmp_path / "demo.json"
    eval_labels_demo.main(["--model", "tiny", "--threads", "1", "--json", str(out)])
    demo = json.loads(out.read_text())["demo"]
    assert len(demo) == 2
    for methods in demo.values():
        for m in methods.values():
            assert m["of"] == 20 and 0 <= m["agree"] <= 20 and sum(m["counts"]) == 24
