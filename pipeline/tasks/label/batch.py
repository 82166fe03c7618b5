"""Batch calibration's estimate of the label prior: sampled once per run, stored, used by every shard.

``label.calibration: batch`` (and ``batch+contextual``) divide each row's label probabilities by the
label's mean probability over a sample of the job's own rows (Zhou et al., ICLR 2024). The sample
(``label.calibration_rows``, spread over every shard and row group: storage/sample.py) is scored on
the run's engine before its first shard, so the sampled rows' prompts are in the prefix cache when
their shards score them. The estimate is written once, exclusively, as
``OUTPUT/_calibration/<run>/label_prior.json`` and carries the run id, the job fingerprint and a
digest of itself: a resumed run, or any other lane, reads that file and applies exactly the same
correction, so every row's output is the same whichever process scored it and whenever.

In ``label.mode: constrained`` the same estimate is made on the labels' first tokens and applied as
a logit bias (first_tokens); the stored ``bias`` is per label in both modes.

Too few distinct sample rows (fewer than 8 per label, all rows identical) cannot estimate a prior:
the run falls back to contextual calibration and says so in the estimate, the summary and a warning.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any

from prefixflow.pipeline.engine_access import Engine
from prefixflow.pipeline.errors import OutputStateError, RowError
from prefixflow.pipeline.hooks import hook
from prefixflow.pipeline.job.config import BATCH_MIN_ROWS_PER_LABEL
from prefixflow.pipeline.storage.layout import Layout
from prefixflow.pipeline.tasks.label.first_tokens import FirstTokens, scored_choices
from prefixflow.pipeline.tasks.label.labeling import CalibrationError, calibration_bias
from prefixflow.pipeline.tasks.label.scoring import LabelChoices, batch_bias
from prefixflow.pipeline.tasks.output_schema import base_record
from prefixflow.pipeline.tasks.rows import Prepared, RowPreparer, derived_id

if (
    TYPE_CHECKING
):  # the label task (pipeline/tasks/label/task.py) calls in here; planning and spec sit above it
    from prefixflow.pipeline.job.spec import JobSpec
    from prefixflow.pipeline.storage.shards import Shard, Shards


@dataclass(frozen=True)
class LabelPrior:
    """The stored correction. ``bias`` is what every row's label log-scores lose before the softmax."""

    method: str  # the job's label.calibration
    applied: str  # what the rows get: the method, or "contextual" ("none") after a fallback
    labels: tuple[str, ...]
    bias: tuple[float, ...] | None  # None: no correction at all (a fallback with no usable reference)
    prior: dict[str, float] = field(default_factory=dict)  # batch part: mean probability per label
    sample_rows: int = 0  # sampled rows scored
    distinct_rows: int = 0  # of those, with distinct prompts
    sample_digest: str = ""  # sha256 of the sampled rows' (file, row) keys
    prompt_tokens: int = 0  # the sampled rows' prompts, each counted once
    scored_tokens: int = 0  # every choice request of the sample (prompt + label), as the engine counts
    cached_tokens: int = 0  # of scored_tokens, served by the prefix cache
    fallback: str | None = None  # why batch calibration was not applied
    run_id: str = ""
    job_fingerprint: str = ""
    digest: str = ""  # sha256 over all of the above: the estimate's own fingerprint

    def sealed(self) -> LabelPrior:
        body = {k: v for k, v in asdict(self).items() if k != "digest"}
        blob = json.dumps(body, sort_keys=True).encode()
        return replace(self, digest=hashlib.sha256(blob).hexdigest()[:16])

    def to_json(self) -> bytes:
        return json.dumps(asdict(self), indent=1, sort_keys=True).encode()

    @classmethod
    def from_json(cls, blob: bytes) -> LabelPrior:
        data = json.loads(blob)
        data["labels"] = tuple(data["labels"])
        data["bias"] = None if data["bias"] is None else tuple(float(b) for b in data["bias"])
        return cls(**data)

    def summary(self) -> dict[str, Any]:
        """What the run summary shows of it."""
        return {
            "method": self.method,
            "applied": self.applied,
            "fallback": self.fallback,
            "sample_rows": self.sample_rows,
            "distinct_rows": self.distinct_rows,
            "prompt_tokens": self.prompt_tokens,
            "computed_tokens": self.scored_tokens - self.cached_tokens,
            "prior": dict(self.prior),
            "digest": self.digest,
        }


def _sample(spec: JobSpec, shards: list[Shard], prep: RowPreparer) -> list[Prepared]:
    from prefixflow.pipeline.storage.sample import sample_rows

    out = []
    for s in sample_rows(spec, shards, spec.config.label.calibration_rows).rows:
        base = base_record(s.row_index, derived_id(s.relpath, s.row_index), s.relpath, {})
        try:
            out.append(prep.prepare(s.row, base, s.relpath, s.row_index))
        except RowError:  # the row is an error row in its shard too; it says nothing about the prior
            continue
    return out


def estimate_prior(
    spec: JobSpec, llm: Engine, shards: list[Shard], run_id: str = "", fingerprint: str = ""
) -> LabelPrior:
    """Sample, score and estimate (on ``llm``, whose prefix cache keeps the sampled prompts)."""
    cfg = spec.config
    prep = RowPreparer(cfg, llm, {}, spec.task)
    choices = scored_choices(cfg, prep.tok)
    rows = _sample(spec, shards, prep)
    usage: list[dict[str, Any]] = []
    scores = llm.score_choices([p.prompt_ids for p in rows], [list(choices.choices)] * len(rows), usage=usage)
    per_row: list[list[float]] = []
    prompts: set[tuple[int, ...]] = set()
    keys = []
    prompt_tokens = scored = cached = 0
    for p, score, use in zip(rows, scores, usage):
        if isinstance(score, str):
            continue
        per_row.append(choices.label_scores(score, use["choice_tokens"], cfg.label.length_norm))
        prompts.add(tuple(p.prompt_ids))
        keys.append([p.base["source_file"], p.base["row_index"]])
        prompt_tokens += len(p.prompt_ids)
        scored += int(use["tokens"])
        cached += int(use["cached_tokens"])
    prior = LabelPrior(
        method=cfg.label.calibration,
        applied=cfg.label.calibration,
        labels=choices.labels,
        bias=None,
        sample_rows=len(per_row),
        distinct_rows=len(prompts),
        sample_digest=hashlib.sha256(json.dumps(keys).encode()).hexdigest()[:16],
        prompt_tokens=prompt_tokens,
        scored_tokens=scored,
        cached_tokens=cached,
        run_id=run_id,
        job_fingerprint=fingerprint,
    )
    return _correction(llm, prep, choices, prior, per_row).sealed()


def _too_few(prior: LabelPrior, num_labels: int) -> str | None:
    need = BATCH_MIN_ROWS_PER_LABEL * num_labels
    if prior.sample_rows > 1 and prior.distinct_rows == 1:
        return f"all {prior.sample_rows} sampled rows have the same prompt, which says nothing about the label prior"
    if prior.distinct_rows < need:
        return (
            f"the sample has {prior.distinct_rows} distinct scorable rows, fewer than "
            f"{BATCH_MIN_ROWS_PER_LABEL} x {num_labels} labels = {need}"
        )
    return None


def _correction(
    llm: Engine,
    prep: RowPreparer,
    choices: LabelChoices | FirstTokens,
    prior: LabelPrior,
    per_row: list[list[float]],
) -> LabelPrior:
    """The prior's bias: batch on top of contextual when asked for, contextual alone after a fallback.
    Estimated per scored choice group (labels, or constrained: first tokens), stored per label."""
    reason = _too_few(prior, len(choices.labels))
    contextual: list[float] | None = None
    if reason is not None or prior.method == "batch+contextual":
        try:
            contextual = calibration_bias(llm, prep, choices)
        except CalibrationError as exc:
            if reason is None:
                raise
            return replace(
                prior, applied="none", fallback=f"{reason}; and contextual calibration failed: {exc}"
            )
    if reason is not None:
        kept = None if contextual is None else tuple(choices.per_label(contextual))
        return replace(
            prior,
            applied="contextual",
            bias=kept,
            fallback=f"{reason}: contextual calibration is used instead",
        )
    bias = batch_bias(per_row, contextual)
    batch_part = bias if contextual is None else [b - c for b, c in zip(bias, contextual)]
    return replace(
        prior,
        bias=tuple(choices.per_label(bias)),
        prior={lb: math.exp(b) for lb, b in zip(choices.labels, choices.per_label(batch_part))},
    )


def read_prior(layout: Layout) -> LabelPrior | None:
    """The run's stored estimate, or None when there is none yet."""
    try:
        if not layout.store.exists(layout.label_prior):
            return None
        blob = layout.store.read_bytes(layout.label_prior)
    except FileNotFoundError:
        return None
    try:
        return LabelPrior.from_json(blob)
    except (ValueError, TypeError, KeyError) as exc:
        raise OutputStateError(
            f"{layout.label_prior} is not a readable label-prior estimate ({exc}); remove it "
            "only if no shard of this run is committed yet, else start over with --new-run"
        ) from exc


def _check(prior: LabelPrior, layout: Layout, fingerprint: str) -> LabelPrior:
    if (
        prior.run_id != layout.run_id
        or prior.job_fingerprint != fingerprint
        or prior.sealed().digest != prior.digest
    ):
        raise OutputStateError(
            f"{layout.label_prior} does not belong to run {layout.run_id} of this job (run {prior.run_id}, "
            f"fingerprint {prior.job_fingerprint}, digest {prior.digest}); a resumed run must use the estimate "
            "its first rows used: restore it, or start over with --new-run"
        )
    return prior


def run_prior(
    spec: JobSpec,
    layout: Layout,
    fingerprint: str,
    llm: Engine,
    shards: Shards | None = None,
    warn: Callable[[str], None] | None = None,
) -> LabelPrior:
    """The run's estimate: the stored one, else estimated now and stored exclusively (when two lanes
    race, the first file written is the one every shard uses)."""
    stored = read_prior(layout)
    if stored is not None:
        return _check(stored, layout, fingerprint)
    if shards is None:
        raise ValueError("batch calibration samples the run's shards: pass them, or how to plan them")
    prior = estimate_prior(spec, llm, shards() if callable(shards) else shards, layout.run_id, fingerprint)
    if not layout.store.create_exclusive(layout.label_prior, prior.to_json()):
        again = read_prior(layout)
        if again is None:
            raise OutputStateError(f"{layout.label_prior} vanished while being read; run the command again")
        return _check(again, layout, fingerprint)
    hook("label_prior_stored")
    if prior.fallback and warn is not None:
        warn(f"label.calibration: {prior.method}: {prior.fallback}")
    return prior
