"""Label scoring math: per-choice log-probabilities in, calibrated label probabilities out.

A small model asked to pick one of several labels leans on the label's surface, not the input:
the label listed first, the shorter label, the label the prompt's wording favours. Contextual
calibration (Zhao et al. 2021, "Calibrate Before Use") measures that lean on content-free inputs
("N/A", "[MASK]" in place of the row's text) and divides it out; domain-conditional PMI
(Holtzman et al. 2021) measures it on the text that introduces the answer alone. Both are
reference prompts scored once per shard, so the cost does not grow with the rows.

benchmarks/eval_labels.py measures every option here (docs/pipeline.md, "Labeling jobs").
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from prefixflow.pipeline.errors import JobConfigError

if TYPE_CHECKING:
    from prefixflow.pipeline.job.config import JobConfig


def surface_forms(label: str, case_variants: bool) -> tuple[str, ...]:
    """The strings that count as answering ``label``: as written, and with the first letter's case
    flipped when ``case_variants`` (a chat answer starts a sentence: "Billing" for "billing")."""
    forms = [label]
    if case_variants and label[:1].isalpha():
        first = label[0]
        flipped = (first.lower() if first.isupper() else first.upper()) + label[1:]
        if flipped not in forms and (first.islower() or label[1:] == label[1:].lower()):
            forms.append(flipped)  # "USA" does not become "uSA"
    return tuple(forms)


def check_distinct_forms(labels: Sequence[str], case_variants: bool) -> None:
    """Refuse two labels that ``case_variants`` would count as one answer (at load, naming both)."""
    seen: dict[str, str] = {}
    for label in labels:
        for form in surface_forms(label, case_variants):
            if form in seen and seen[form] != label:
                raise JobConfigError(
                    f"job config: label.labels: {seen[form]!r} and {label!r} differ only in the "
                    "case of their first letter, which case_variants treats as the same answer; "
                    "rename one or set label.case_variants: false"
                )
            seen[form] = label


@dataclass(frozen=True)
class LabelChoices:
    """Every choice string scored per row, and the label each one counts for."""

    labels: tuple[str, ...]
    choices: tuple[str, ...]
    owner: tuple[int, ...]  # label index of each choice

    @classmethod
    def build(cls, labels: Sequence[str], choice_prefix: str, case_variants: bool) -> LabelChoices:
        choices: list[str] = []
        owner: list[int] = []
        for k, label in enumerate(labels):
            for form in surface_forms(label, case_variants):
                choices.append(choice_prefix + form)
                owner.append(k)
        return cls(tuple(labels), tuple(choices), tuple(owner))

    def label_scores(self, logprobs: Sequence[float], tokens: Sequence[int], length_norm: str) -> list[float]:
        """One log-score per label: each choice's total (``sum``) or per-token (``mean``) log-prob,
        then the log of the summed probability of the label's surface forms."""
        per_label: list[list[float]] = [[] for _ in self.labels]
        for k, lp, n in zip(self.owner, logprobs, tokens):
            per_label[k].append(lp / max(n, 1) if length_norm == "mean" else lp)
        return [logsumexp(values) for values in per_label]

    def per_label(self, values: Sequence[float]) -> list[float]:
        """Per-label values as they are (``FirstTokens`` maps its per-token ones onto the labels)."""
        return list(values)


def label_choices(cfg: JobConfig) -> LabelChoices:
    label = cfg.label
    return LabelChoices.build(label.labels, label.choice_prefix, label.case_variants)


def logsumexp(values: Sequence[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def softmax(scores: Sequence[float]) -> list[float]:
    top = max(scores)
    weights = [math.exp(s - top) for s in scores]
    total = sum(weights)
    return [w / total for w in weights]


def reference_bias(reference_scores: Sequence[Sequence[float]]) -> list[float] | None:
    """The log of the mean label distribution over the reference prompts (content-free inputs or
    the domain premise): what the model answers when the row says nothing. None without references."""
    if not reference_scores:
        return None
    dists = [softmax(s) for s in reference_scores]
    return [math.log(max(sum(d[k] for d in dists) / len(dists), 1e-300)) for k in range(len(dists[0]))]


def calibrated_probs(scores: Sequence[float], bias: Sequence[float] | None) -> list[float]:
    """p(label | row) / p(label | reference), renormalized to sum to 1 (plain softmax without a bias)."""
    if bias is None:
        return softmax(scores)
    return softmax([s - b for s, b in zip(scores, bias)])


def batch_bias(row_scores: Sequence[Sequence[float]], base: Sequence[float] | None) -> list[float]:
    """Batch calibration (Zhou et al., ICLR 2024): the log of each label's mean probability over the
    sampled rows, after ``base`` (a contextual bias, or None) is divided out, plus ``base``: the whole
    log correction that ``calibrated_probs`` subtracts from a row's scores. Estimating the prior from
    the rows themselves needs no content-free prompt; it assumes the rows are not dominated by one label."""
    if not row_scores:
        raise ValueError("batch calibration needs at least one scored row")
    dists = [calibrated_probs(s, base) for s in row_scores]
    k = len(dists[0])
    prior = [math.log(max(sum(d[j] for d in dists) / len(dists), 1e-300)) for j in range(k)]
    return prior if base is None else [p + b for p, b in zip(prior, base)]
