"""Label jobs in score mode: score every label as the row's answer, calibrate, report probabilities.

``label.mode: constrained`` rows get the same corrections as a logit bias on the labels' first tokens
(``constrained_rows``, first_tokens). Batch calibration's correction is estimated once per run from a sample of its rows and stored
(label_batch); for contextual/domain, per shard, the reference prompts (label_references) are scored
once with the same choices as the rows; their mean label distribution is the model's lean that
calibration divides out (label_scoring). Rows are then scored in batches, each row coming out as soon as its own labels are
scored; each gets the most probable label, ``label_probs`` (calibrated, summing to 1) and
``label_logprobs_raw`` (each label's log-score before calibration, to recalibrate without rerunning).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from typing import Any

from prefixflow.pipeline.engine_access import Engine
from prefixflow.pipeline.errors import ENGINE_ERROR, PipelineError
from prefixflow.pipeline.tasks.label.first_tokens import FirstTokens, with_logit_bias
from prefixflow.pipeline.tasks.label.references import reference_texts
from prefixflow.pipeline.tasks.label.scoring import (
    LabelChoices,
    calibrated_probs,
    label_choices,
    reference_bias,
)
from prefixflow.pipeline.tasks.output_schema import error_record
from prefixflow.pipeline.tasks.rows import Prepared, RowPreparer


class CalibrationError(PipelineError):
    """No reference prompt of the job's label calibration could be scored (the shard cannot run)."""


def calibration_bias(
    llm: Engine, prep: RowPreparer, choices: LabelChoices | FirstTokens
) -> list[float] | None:
    """The log label (or, constrained, first-token) distribution on the job's reference prompts; None
    for ``calibration: none``."""
    cfg = prep.cfg
    if cfg.label.calibration == "none":
        return None
    texts, problems = reference_texts(cfg, prep.template)
    prompts = [prep.encode_reference(t) for t in texts]
    usage: list[dict[str, Any]] = []
    scores = llm.score_choices(prompts, [list(choices.choices)] * len(prompts), usage=usage)
    reference = []
    for text, score, use in zip(texts, scores, usage):
        if isinstance(score, str):
            problems.append(f"{text!r}: {score}")
        else:
            reference.append(choices.label_scores(score, use["choice_tokens"], cfg.label.length_norm))
    if not reference:
        raise CalibrationError(
            f"label.calibration: {cfg.label.calibration}: no reference prompt could be scored ("
            + "; ".join(problems)
            + "); change label.content_free or the template, or set label.calibration: none"
        )
    return reference_bias(reference)


def score_labels(
    llm: Engine,
    prep: RowPreparer,
    rows: list[Prepared],
    batch: int,
    bias: Sequence[float] | None | str = "shard",
) -> Iterator[dict[str, Any]]:
    """Score, calibrate and label ``rows``. ``bias``: the run's stored correction (batch calibration,
    label_batch.py; None for no correction), or ``"shard"``: the reference prompts' bias, measured here."""
    if not rows:
        return
    cfg = prep.cfg
    choices = label_choices(cfg)
    if isinstance(bias, str):
        bias = calibration_bias(llm, prep, choices)
    for i in range(0, len(rows), batch):
        chunk = rows[i : i + batch]
        start = time.perf_counter()
        stream = llm.score_choices_stream([p.prompt_ids for p in chunk], [list(choices.choices)] * len(chunk))
        # Each row is yielded as soon as its own choices are scored (so progress and flushing move row
        # by row, not once per batch). Per row: prompt_tokens is the row's own tokenized prompt (counted
        # once, not once per label); cached_tokens is that prompt scaled by the share of the row's
        # scoring tokens (prompt + each label) the prefix cache served; nothing is generated;
        # latency_s is the time from the batch's start until this row's scores were complete.
        for k, score, use in stream:
            p = chunk[k]
            share = use["cached_tokens"] / use["tokens"] if use["tokens"] else 0.0
            counts = {
                "prompt_tokens": len(p.prompt_ids),
                "cached_tokens": round(len(p.prompt_ids) * share),
                "output_tokens": 0,
                "latency_s": time.perf_counter() - start,
            }
            if isinstance(score, str):
                yield error_record(p.base, ENGINE_ERROR, score, **counts)
                continue
            per_label = choices.label_scores(score, use["choice_tokens"], cfg.label.length_norm)
            probs = dict(zip(choices.labels, calibrated_probs(per_label, bias)))
            best = max(choices.labels, key=lambda lb: probs[lb])
            yield {
                **p.base,
                **counts,
                "finish_reason": "stop",
                "label": best,
                "label_probs": probs,
                "label_logprobs_raw": dict(zip(choices.labels, per_label)),
            }


def constrained_rows(
    llm: Engine, prep: RowPreparer, rows: list[Prepared], bias: Sequence[float] | None | str = "shard"
) -> list[Prepared]:
    """``label.mode: constrained`` rows with the job's calibration as a logit bias on the labels' first
    tokens. ``bias``: per label, as in ``score_labels`` (the run's stored estimate, None, or ``"shard"``)."""
    if not rows:
        return rows
    first = FirstTokens.build(prep.cfg, prep.tok)
    if isinstance(bias, str):
        measured = calibration_bias(llm, prep, first)
        bias = None if measured is None else first.per_label(measured)
    return rows if bias is None else with_logit_bias(rows, first.logit_bias(bias))
