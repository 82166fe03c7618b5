"""Calibration in ``label.mode: constrained``: the correction is a logit bias on the labels' first tokens.

Under the label grammar a label's remaining tokens are forced once its first token is out, so which
label a constrained row gets is decided by the model's distribution over the labels' first tokens: that
is where the lean is, and what is corrected. Each label's first token is the tokenizer's first token of
``choice_prefix + label`` (the path a model takes). The score-mode estimates are made on that
distribution (each first token scored as a one-token choice): ``contextual``/``domain`` on the reference
prompts, ``batch`` as its mean over the sample (on top of contextual for ``batch+contextual``), and a
row's ``SamplingParams.logit_bias`` is minus that log correction on each first token. The grammar's
softmax at the first step then holds p(token | row) / prior(token) for the labels' first tokens, as
score mode's ``calibrated_probs`` does for whole labels. Labels that share a first token share one
correction (``plan --advise`` flags them); other tokenizations of a label the grammar also allows are
not biased.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from prefixflow.pipeline.tasks.label.scoring import LabelChoices, label_choices

if TYPE_CHECKING:
    from prefixflow.pipeline.engine_access import Tokenizer
    from prefixflow.pipeline.job.config import JobConfig
    from prefixflow.pipeline.tasks.rows import Prepared


@dataclass(frozen=True)
class FirstTokens:
    """The labels' distinct first tokens: what a constrained job's calibration scores and biases."""

    labels: tuple[str, ...]
    tokens: tuple[int, ...]  # distinct, in label order
    owner: tuple[int, ...]  # per label: the index of its first token in ``tokens``

    @classmethod
    def build(cls, cfg: JobConfig, tokenizer: Tokenizer) -> FirstTokens:
        tokens: list[int] = []
        owner: list[int] = []
        for label in cfg.label.labels:
            ids = tokenizer.encode(cfg.label.choice_prefix + label, add_special_tokens=False)
            if not ids:
                raise ValueError(f"label {label!r} tokenizes to nothing")
            if ids[0] not in tokens:
                tokens.append(ids[0])
            owner.append(tokens.index(ids[0]))
        return cls(tuple(cfg.label.labels), tuple(tokens), tuple(owner))

    @property
    def choices(self) -> tuple[tuple[int], ...]:
        return tuple((t,) for t in self.tokens)

    def label_scores(self, logprobs: Sequence[float], tokens: Sequence[int], length_norm: str) -> list[float]:
        """One log-score per first token (each choice is exactly one token: nothing to fold)."""
        return list(logprobs)

    def per_label(self, values: Sequence[float]) -> list[float]:
        return [values[k] for k in self.owner]

    def logit_bias(self, label_bias: Sequence[float]) -> dict[int, float]:
        """``label_bias`` (per label, what score mode subtracts) as the first tokens' logit bias."""
        return {self.tokens[k]: -float(b) for k, b in zip(self.owner, label_bias)}


def scored_choices(cfg: JobConfig, tokenizer: Tokenizer) -> LabelChoices | FirstTokens:
    """What a label job's calibration scores: whole labels (score mode) or first tokens (constrained)."""
    if cfg.label.mode == "constrained":
        return FirstTokens.build(cfg, tokenizer)
    return label_choices(cfg)


def with_logit_bias(rows: list[Prepared], bias: dict[int, float]) -> list[Prepared]:
    """The rows with ``bias`` added to their own ``sampling.logit_bias`` (the two add up per token)."""
    out = []
    for p in rows:
        merged: dict[int, float] = dict(p.params.logit_bias or {})
        for token, value in bias.items():
            merged[token] = merged.get(token, 0.0) + value
        out.append(replace(p, params=replace(p.params, logit_bias=merged)))
    return out
