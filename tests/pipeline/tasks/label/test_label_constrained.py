"""Calibration in ``label.mode: constrained`` (issue 26): the estimate is made on the labels' first tokens
and applied as a logit bias on them. Checked against a hand computation from the engine's own first-token
scores, and each row's label against the engine generating under that bias."""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl
import pytest

from prefixflow.engine import SamplingParams, StructuredOutputs
from prefixflow.pipeline import load_job
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import job, write_parquet
from tests.pipeline.tasks.label.test_label_batch import LABELS, TEMPLATE, _rows, _softmax

MAX_TOKENS = 12


def _first_tokens(llm) -> list[int]:
    """Per label, its first token; on the tiny tokenizer " negative" and " neutral" share one (" ne")."""
    return [llm.tokenizer.encode(" " + lb, add_special_tokens=False)[0] for lb in LABELS]


def _expected_bias(llm, rows: list[dict], method: str) -> tuple[list[float], list[float] | None]:
    """(the per-label log correction, the per-label batch prior or None), by hand from the engine's
    scores of each distinct first token; labels sharing a first token share its correction."""
    tokens = _first_tokens(llm)
    distinct = list(dict.fromkeys(tokens))
    assert len(distinct) == 2  # the shared first token is part of what is checked

    def scores(prompt: str) -> list[float]:
        return llm.score_choices([llm.tokenizer.encode(prompt)], [[[t] for t in distinct]])[0]

    n = len(distinct)
    refs = [_softmax(scores(TEMPLATE.replace("{{ text }}", v))) for v in ("N/A", "[MASK]")]
    contextual = [math.log((refs[0][k] + refs[1][k]) / 2) for k in range(n)]
    prior = None
    if method == "contextual":
        bias = contextual
    else:
        base = contextual if method == "batch+contextual" else [0.0] * n
        raw = [scores(TEMPLATE.replace("{{ text }}", r["text"])) for r in rows]
        shifted = [_softmax([s - b for s, b in zip(r, base)]) for r in raw]
        prior = [sum(d[k] for d in shifted) / len(rows) for k in range(n)]
        bias = [math.log(p) + b for p, b in zip(prior, base)]
    per_label = [bias[distinct.index(t)] for t in tokens]
    return per_label, None if prior is None else [prior[distinct.index(t)] for t in tokens]


def _run(tmp_path: Path, llm, rows: list[dict], method: str, name: str):
    cfg = job(
        "label",
        chat="off",
        template=TEMPLATE,
        sampling={"max_tokens": MAX_TOKENS},
        label={"mode": "constrained", "calibration": method},
        output={"shard_rows": 10},
    )
    spec = load_job(str(tmp_path / "in"), str(tmp_path / name), "tiny", cfg)
    summary, failures = run_local(spec, llm=llm, progress=False)
    assert failures == [] and summary.complete
    return summary, pl.read_parquet(summary.data_glob).sort("row_index")


@pytest.mark.parametrize("method", ["batch", "batch+contextual", "contextual"])
def test_constrained_labels_are_generated_under_the_first_token_correction(
    tmp_path: Path, tiny_llm, method: str
) -> None:
    rows = _rows(30)
    write_parquet(tmp_path / "in" / "rows.parquet", rows)
    summary, df = _run(tmp_path, tiny_llm, rows, method, "out")
    bias, prior = _expected_bias(tiny_llm, rows, method)
    if prior is not None:  # the stored estimate: per label, the first tokens' mean probability
        cal = summary.label_calibration
        assert cal["applied"] == method and cal["fallback"] is None and cal["sample_rows"] == len(rows)
        assert cal["prior"] == pytest.approx(dict(zip(LABELS, prior)), abs=1e-6)
    logit_bias = {t: -b for t, b in zip(_first_tokens(tiny_llm), bias)}
    constraint = StructuredOutputs(choice=tuple(" " + lb for lb in LABELS))
    prompts = [TEMPLATE.replace("{{ text }}", r["text"]) for r in rows]
    want = tiny_llm.generate(
        prompts, SamplingParams(max_tokens=MAX_TOKENS, structured=constraint, logit_bias=logit_bias)
    )
    plain = tiny_llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, structured=constraint))
    assert df["finish_reason"].to_list() == ["stop"] * len(rows)
    assert df["label"].to_list() == [o.text.strip() for o in want]
    assert [o.text for o in want] != [o.text for o in plain]  # the correction changed some rows


def test_calibration_none_leaves_constrained_rows_alone(tmp_path: Path, tiny_llm) -> None:
    rows = _rows(12)
    write_parquet(tmp_path / "in" / "rows.parquet", rows)
    summary, df = _run(tmp_path, tiny_llm, rows, "none", "out")
    constraint = StructuredOutputs(choice=tuple(" " + lb for lb in LABELS))
    prompts = [TEMPLATE.replace("{{ text }}", r["text"]) for r in rows]
    plain = tiny_llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS, structured=constraint))
    assert df["label"].to_list() == [o.text.strip() for o in plain]
    assert summary.label_calibration is None or summary.label_calibration.get("applied") in (None, "none")
