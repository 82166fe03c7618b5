"""Labeling quality floors of batch calibration (issue 26) beside contextual calibration, on the
embedded SmolLM2-135M-Instruct and the project's three labeled sets, chat and plain prompt styles.

Each (set, style) is scored once with the pipeline's own prompt building and scoring math
(``benchmarks.eval_labels.score_style``); contextual and batch calibration are then evaluated on the
same scores (``method_probs``: the pipeline's ``reference_bias`` / ``batch_bias``; with these sets the
256-row sample is every row). One case also runs the default job end to end through ``run_local`` and
checks it equals the offline figures. The floors sit a row or two under the numbers in
benchmarks/RESULTS.md (issue 26), so a regression in scoring, calibration, prompts or the model
fails here. The same scoring took 15 minutes in the benchmark run on 2 cores loaded by ~9 other
sessions (it replaces issue 14's 259 s pipeline runs of this file), hence slow.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks.eval_labels import SETS, method_probs, pipeline_run, read_jsonl, score_style
from benchmarks.label_metrics import label_metrics

pytestmark = pytest.mark.slow

DEFAULT = "batch+contextual"  # the pipeline's default label.calibration
# (set, style): (accuracy floor of the default, largest-share ceiling, measured default / contextual accuracy)
# The two-class reviews allow one or two rows over half (measured 31 and 32 of 60; contextual: 0.57, 0.53).
FLOORS: dict[tuple[str, str], tuple[float, float, str]] = {
    ("tickets", "chat"): (0.52, 0.50, "0.54 / 0.49"),
    ("tickets", "plain"): (0.71, 0.50, "0.73 / 0.68"),
    ("news", "chat"): (0.80, 0.50, "0.825 / 0.725"),
    ("news", "plain"): (0.93, 0.50, "0.95 / 0.95"),
    ("reviews", "chat"): (0.95, 0.55, "0.983 / 0.933"),
    ("reviews", "plain"): (0.93, 0.55, "0.967 / 0.967"),
}
_SCORES: dict[tuple[str, str], dict] = {}  # one scoring per (set, style), shared by the tests below


@pytest.fixture(scope="module")
def smollm2():
    from prefixflow.engine import LLM

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield LLM(model="smollm2-135m-instruct", dtype="float32")
    torch.set_num_threads(before)


def _scores(llm, label_set, style, rows) -> dict:
    key = (label_set.name, style.name)
    if key not in _SCORES:
        _SCORES[key] = score_style(llm, label_set, style, rows)
    return _SCORES[key]


def _case(set_name: str, style_name: str):
    label_set = next(s for s in SETS if s.name == set_name)
    return label_set, next(s for s in label_set.styles if s.name == style_name)


@pytest.mark.parametrize(("set_name", "style_name"), list(FLOORS))
def test_batch_calibration_beats_contextual_and_stays_above_its_floor(
    smollm2, set_name: str, style_name: str
) -> None:
    label_set, style = _case(set_name, style_name)
    rows = read_jsonl(label_set.file)
    k = len(label_set.labels)
    assert [r["label"] for r in rows].count(label_set.labels[0]) == len(rows) // k  # balanced
    gold = [label_set.labels.index(r["label"]) for r in rows]
    raw = _scores(smollm2, label_set, style, rows)
    got = {
        m: label_metrics(gold, method_probs(label_set, style, raw, m, "sum", True), k)
        for m in (DEFAULT, "contextual")
    }
    floor, max_share, _ = FLOORS[(set_name, style_name)]
    assert got[DEFAULT]["accuracy"] >= got["contextual"]["accuracy"], got
    assert got[DEFAULT]["accuracy"] >= floor, got
    assert got[DEFAULT]["largest_share"] <= max_share, got


def test_the_default_job_end_to_end_equals_the_offline_figures(smollm2) -> None:
    label_set, style = _case("tickets", "chat")
    rows = read_jsonl(label_set.file)
    gold = [label_set.labels.index(r["label"]) for r in rows]
    raw = _scores(smollm2, label_set, style, rows)
    offline = label_metrics(
        gold, method_probs(label_set, style, raw, DEFAULT, "sum", True), len(label_set.labels)
    )
    result = pipeline_run(smollm2, "smollm2-135m-instruct", label_set, style, rows)
    assert result["calibration"]["applied"] == DEFAULT and result["calibration"]["sample_rows"] == len(rows)
    assert result["predicted"] == offline["predicted"] and result["accuracy"] == offline["accuracy"]
