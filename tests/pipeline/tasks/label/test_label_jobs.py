"""Label jobs in score mode (issue 14): calibrated probabilities checked against the engine's own
scores computed by hand, null/blank templated fields as error rows, and the label config's errors."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from prefixflow.pipeline import JobConfigError, load_job
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import job, write_parquet

LABELS = ("positive", "negative", "neutral")
TEXTS = ["great value, works well", "broke after a day", "it is a kettle", "fine I guess", "awful smell"]


def _run(tmp_path: Path, llm, cfg: dict, rows: list[dict]) -> tuple[object, pl.DataFrame]:
    write_parquet(tmp_path / "in" / "rows.parquet", rows)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    summary, failures = run_local(spec, llm=llm, progress=False)
    assert failures == []
    return summary, pl.read_parquet(summary.data_glob).sort("row_index")


def _softmax(xs: list[float]) -> list[float]:
    top = max(xs)
    w = [math.exp(x - top) for x in xs]
    return [v / sum(w) for v in w]


def _expected(llm, prompt: str, refs: list[str], norm: str, case: bool) -> dict[str, float]:
    """The calibrated distribution from raw engine scores, computed independently of label_scoring."""
    tok = llm.tokenizer
    forms = {lb: [lb] + ([lb.capitalize()] if case else []) for lb in LABELS}
    flat = [" " + f for lb in reversed(LABELS) for f in reversed(forms[lb])]  # another order than the job's

    def per_label(text: str) -> list[float]:
        scores = llm.score_choices([tok.encode(text)], [flat])[0]
        by_choice = {
            c: s / (len(tok.encode(c, add_special_tokens=False)) if norm == "mean" else 1)
            for c, s in zip(flat, scores)
        }
        return [math.log(sum(math.exp(by_choice[" " + f]) for f in forms[lb])) for lb in LABELS]

    row = per_label(prompt)
    if refs:
        dists = [_softmax(per_label(r)) for r in refs]
        mean = [sum(d[k] for d in dists) / len(dists) for k in range(len(LABELS))]
        row = [s - math.log(m) for s, m in zip(row, mean)]
    return dict(zip(LABELS, _softmax(row)))


@pytest.mark.parametrize(
    ("label_cfg", "refs"),
    [
        ({}, ["Review: N/A\nVerdict:", "Review: [MASK]\nVerdict:"]),  # the default
        (
            {"content_free": ["N/A", "", "[MASK]"]},
            ["Review: N/A\nVerdict:", "Review: \nVerdict:", "Review: [MASK]\nVerdict:"],
        ),  # Zhao et al.'s three
        ({"calibration": "none", "length_norm": "mean", "case_variants": False}, []),
        ({"calibration": "domain", "case_variants": False}, ["Verdict:"]),
        ({"content_free": ["nothing"], "length_norm": "mean"}, ["Review: nothing\nVerdict:"]),
    ],
)
def test_label_probs_are_the_calibrated_engine_scores(
    tmp_path: Path, tiny_llm, label_cfg: dict, refs
) -> None:
    cfg = job("label", chat="off", template="Review: {{ text }}\nVerdict:", label=label_cfg)
    _, df = _run(tmp_path, tiny_llm, cfg, [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)])
    norm = label_cfg.get("length_norm", "sum")
    case = label_cfg.get("case_variants", True)
    for row in df.to_dicts():
        want = _expected(tiny_llm, f"Review: {TEXTS[row['row_index']]}\nVerdict:", refs, norm, case)
        assert row["label_probs"] == pytest.approx(want, abs=1e-6)
        assert math.isclose(sum(row["label_probs"].values()), 1.0, rel_tol=1e-9)
        assert row["label"] == max(want, key=want.get)


def test_calibration_changes_the_probabilities(tmp_path: Path, tiny_llm) -> None:
    rows = [{"id": f"r{i}", "text": t} for i, t in enumerate(TEXTS)]
    probs = {}
    for mode in ("none", "contextual"):
        cfg = job("label", chat="off", template="Review: {{ text }}\nVerdict:", label={"calibration": mode})
        _, df = _run(tmp_path / mode, tiny_llm, cfg, rows)
        probs[mode] = df["label_probs"].to_list()
    assert probs["none"][0] != pytest.approx(probs["contextual"][0], abs=1e-3)


@pytest.mark.parametrize("template", ["Message: {{ body }}", "{{ subject }}\n\n{{ body }}"])
def test_a_null_or_blank_templated_field_is_an_error_row_not_a_label(
    tmp_path: Path, tiny_llm, template
) -> None:
    """Regression (issue 14): a null body rendered as 'Message: None' and was labeled at p~0.98."""
    rows = [
        {"id": "ok", "subject": "refund", "body": "I was charged twice"},
        {"id": "null", "subject": "refund", "body": None},
        {"id": "blank", "subject": "refund", "body": "  \n "},
        {"id": "empty", "subject": "refund", "body": ""},
    ]
    summary, df = _run(tmp_path, tiny_llm, job("label", chat="off", template=template), rows)
    got = {r["id"]: r for r in df.to_dicts()}
    assert got["ok"]["error"] is None and got["ok"]["label"] in LABELS
    for rid, cls, word in (
        ("null", "null_prompt", "null"),
        ("blank", "empty_prompt", "blank"),
        ("empty", "empty_prompt", "blank"),
    ):
        row = got[rid]
        assert row["error_class"] == cls and row["label"] is None and row["label_probs"] is None
        assert f"column 'body' is {word}" in row["error"] and "{% if body %}" in row["error"]
    assert summary.errors_by_class == {"empty_prompt": 2, "null_prompt": 1}


def test_a_template_that_handles_a_null_field_labels_the_row(tmp_path: Path, tiny_llm) -> None:
    template = "Subject: {{ subject }}{% if body %}\nMessage: {{ body }}{% endif %}"
    rows = [
        {"id": "null", "subject": "refund", "body": None},
        {"id": "set", "subject": "refund", "body": "hi"},
    ]
    summary, df = _run(tmp_path, tiny_llm, job("label", chat="off", template=template), rows)
    assert summary.error_rows == 0 and set(df["label"]) <= set(LABELS)


@pytest.mark.parametrize(
    ("label_cfg", "template", "needles"),
    [
        ({"calibration": "platt"}, None, ["label.calibration", "contextual, domain, none"]),
        ({"length_norm": "max"}, None, ["label.length_norm", "sum, mean"]),
        ({"case_variants": "yes"}, None, ["label.case_variants", "true or false"]),
        ({"content_free": []}, None, ["label.content_free", "non-empty list"]),
        ({"content_free": "N/A"}, None, ["label.content_free", "non-empty list"]),
        ({"labels": ["Yes", "yes"]}, None, ["label.labels", "'Yes' and 'yes'", "case_variants: false"]),
        ({"calibration": "domain"}, "Classify: {{ text }}", ["label.calibration: domain", "after its last"]),
        (
            {"calibration": "contextual"},
            "{{ text.split()[3] }}",
            ["label.content_free", "every content-free input", "calibration: none"],
        ),
        ({"calibration": "batch+contextual"}, "{{ text.split()[3] }}", ["label.content_free"]),
        ({"calibration_rows": 0}, None, ["label.calibration_rows", "positive integer"]),
    ],
)
def test_bad_label_settings_fail_at_load(label_cfg: dict, template: str | None, needles: list[str]) -> None:
    cfg = job("label", chat="off", label=label_cfg, **({"template": template} if template else {}))
    with pytest.raises(JobConfigError) as info:
        load_job("in/", "", "tiny", cfg)
    for needle in needles:
        assert needle in str(info.value), str(info.value)


def test_labels_differing_in_case_are_fine_without_case_variants() -> None:
    cfg = job("label", label={"labels": ["Yes", "yes"], "case_variants": False})
    assert load_job("in/", "", "tiny", cfg).config.label.labels == ("Yes", "yes")
