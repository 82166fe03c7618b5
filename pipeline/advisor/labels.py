"""Advice for label jobs: what the label calibration will cost, and labels that compete unfairly.

Batch calibration (label_batch.py) scores ``label.calibration_rows`` sampled rows before the first
shard: that many extra prompts, each scored once per label choice. Their prompts stay in the prefix
cache, so when the sampled rows come up in their shards most of it is served again, but the sample
itself is extra work, and the advisor says how much. Labels whose choice strings start with the same
token cannot be told apart by the first generated token: under ``mode: constrained`` the first token
is picked before they differ, so the label sharing it with others competes with their summed mass
(and the first-token calibration of constrained mode can only correct them together).
"""

from __future__ import annotations

from typing import Any

from prefixflow.pipeline.advisor.render import Rendered
from prefixflow.pipeline.job.config import (
    BATCH_CALIBRATIONS,
    BATCH_MIN_ROWS_PER_LABEL,
    CALIBRATED_MODES,
    JobConfig,
)
from prefixflow.pipeline.storage.sample import Sample
from prefixflow.pipeline.tasks.label.first_tokens import scored_choices
from prefixflow.pipeline.tasks.label.scoring import label_choices


def shared_first_tokens(cfg: JobConfig, tokenizer: Any) -> list[dict[str, Any]]:
    """Groups of labels whose ``choice_prefix + label`` begin with the same token (the case-flipped
    forms too in score mode), with that token."""
    first: dict[int, list[str]] = {}
    forms = label_choices(cfg) if cfg.label.mode == "score" else None
    pairs = (
        [(forms.labels[k], c) for k, c in zip(forms.owner, forms.choices)]
        if forms is not None
        else [(lb, cfg.label.choice_prefix + lb) for lb in cfg.label.labels]
    )
    for label, choice in pairs:
        ids = tokenizer.encode(choice, add_special_tokens=False)
        if ids:
            owners = first.setdefault(int(ids[0]), [])
            if label not in owners:
                owners.append(label)
    return [
        {"token": tokenizer.decode([t]), "token_id": t, "labels": lbs}
        for t, lbs in first.items()
        if len(lbs) > 1
    ]


def label_advice(cfg: JobConfig, tokenizer: Any, rendered: Rendered, sample: Sample) -> dict[str, Any]:
    """The ``labels`` section of the advice (empty for other tasks)."""
    if cfg.task != "label":
        return {}
    label = cfg.label
    calibrated = label.mode in CALIBRATED_MODES
    out: dict[str, Any] = {"mode": label.mode, "calibration": label.calibration if calibrated else "none"}
    collisions = shared_first_tokens(cfg, tokenizer)
    out["shared_first_tokens"] = collisions
    notes = []
    for c in collisions:
        names = ", ".join(repr(lb) for lb in c["labels"])
        if label.mode == "constrained":
            notes.append(
                f"labels {names} start with the same token {c['token']!r}: under mode: constrained the "
                "first token is chosen before they differ, so they compete unfairly with the others "
                "and calibration can only correct them together; rename them so they start "
                "differently, or use mode: score"
            )
        else:
            notes.append(
                f"labels {names} start with the same token {c['token']!r}; fine in score mode (every "
                "label is scored whole), unfair under mode: constrained"
            )
    if calibrated and label.calibration in BATCH_CALIBRATIONS:
        rows = min(label.calibration_rows, sample.total_rows)
        per_row = sum(rendered.prompt_tokens) / len(rendered.prompt_tokens) if rendered.prompt_tokens else 0.0
        choices = len(scored_choices(cfg, tokenizer).choices)  # constrained: the distinct first tokens
        prompt_tokens = round(per_row * rows)
        distinct = len({tuple(r.tokens) for r in rendered.requests})
        need = BATCH_MIN_ROWS_PER_LABEL * len(label.labels)
        out["batch_sample"] = {
            "rows": rows,
            "prompt_tokens": prompt_tokens,
            "scoring_requests": rows * choices,
            "share_of_input_rows": rows / sample.total_rows if sample.total_rows else 0.0,
            "fallback_expected": distinct < need,
        }
        notes.append(
            f"batch calibration scores {rows:,} sampled rows before the first shard: ~{prompt_tokens:,} "
            f"extra prompt tokens ({rows * choices:,} scoring requests; "
            f"{out['batch_sample']['share_of_input_rows']:.1%} of the input's rows), most of them "
            "served again from the prefix cache when those rows' shards run"
        )
        if distinct < need:
            notes.append(
                f"only {distinct} distinct prompts in the advisor's sample, fewer than "
                f"{BATCH_MIN_ROWS_PER_LABEL} x {len(label.labels)} labels: the run will fall back to "
                "contextual calibration"
            )
    if calibrated and label.calibration in ("contextual", "domain", "batch+contextual"):
        refs = 1 if label.calibration == "domain" else len(label.content_free)
        out["references_per_shard"] = refs
    out["notes"] = notes
    return out
