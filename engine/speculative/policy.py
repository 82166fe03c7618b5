"""``num_speculative_tokens: auto``: how many drafts each request gets this step (0 allowed).

The expected tokens a request emits with k drafts of per-draft acceptance alpha are
1 + alpha + ... + alpha^k; the j-th draft adds alpha^j. Drafts of different origins in one run (a
grammar-forced stretch, then looked-up tokens) have their own alphas: the j-th adds their product. The step's cost comes from ``LinearCost``
over (tokens, sampled rows, distinct draft lengths): requests verifying k+1 rows form attention chunks of
their own per k, a fixed cost per layer that a per-token slope missed (batch 64 on an AMX CPU: auto 0.94x off
on the `varied` chat prompts, benchmarks/RESULTS.md issue 24 "Eighth round").
Drafts are added best-first (highest alpha^j) while the step's expected tokens per second rise; the
plan is kept only when it beats plain decoding by ``MARGIN``, so an uncertain estimate decodes plainly.
At batch 1 a step costs about its fixed part and drafts are nearly free; at a large batch every
token costs about the same and a draft pays only when it is nearly always accepted.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from prefixflow.engine.speculative.cost_model import LinearCost

MARGIN = 0.05  # a plan must promise this much over plain decoding
PRIOR_ACCEPTANCE = 0.5
PRIOR_WEIGHT = 4.0  # pseudo-drafts of the method-wide rate behind each request's own rate
CAUTION = 1.0  # standard errors taken off a request's acceptance before planning with it


@dataclass
class Acceptance:
    """Drafts proposed and accepted (per request, and per method)."""

    proposed: int = 0
    accepted: int = 0

    def observe(self, proposed: int, accepted: int) -> None:
        self.proposed += proposed
        self.accepted += accepted

    def rate(self, prior: float) -> float:
        return (self.accepted + PRIOR_WEIGHT * prior) / (self.proposed + PRIOR_WEIGHT)

    def cautious_rate(self, prior: float) -> float:
        """``rate`` less ``CAUTION`` standard errors, but not below the prior (nor its own rate, where
        that is lower): what the policy plans with. The requests whose past rate looks best are
        picked, so their next drafts tend to do worse than it says (at batch 64 on chat prompts, 0.63
        accepted where the plan counted on about 0.85, RESULTS issue 27): caution takes back what
        their record adds over the prior, a few observations' worth nearly all, many little. A
        request without a record was not picked for one: it plans with the prior itself. Caution
        below the prior would lock the policy: drafts too cheap to take never get the verification
        that would raise the rate (a whole summarization cell drafted nothing once its method-wide
        rate began at 1 of 5)."""
        mean = self.rate(prior)
        n = self.proposed + PRIOR_WEIGHT
        return max(mean - CAUTION * math.sqrt(mean * (1.0 - mean) / n), min(mean, prior))


CALIBRATION_DECAY = 0.99  # per verified run: the calibration remembers about the last 100 runs
CALIBRATION_PRIOR = 8.0  # pseudo-tokens of "as expected" behind the first runs' ratio


@dataclass
class Calibration:
    """How the plans' expected accepted drafts compare with what the target accepted, engine-wide.

    Per-request rates, even cautious ones, are estimated on the drafts that made those requests look
    good, and the policy then picks exactly those requests: the winner's curse. Where the planned
    drafts come in below their expectation, ``factor`` (realized / expected over recent runs, at
    most 1) scales every gain the plan counts on, so the next plans ask for more. It never raises a
    gain: where the estimates are pessimistic the plans stay as cautious as their rates make them.
    One per looked-up origin (a request's own lookup, cross-request): their biases differ."""

    expected: float = 0.0
    realized: float = 0.0

    def observe(self, expected: float, realized: int) -> None:
        self.expected = CALIBRATION_DECAY * self.expected + expected
        self.realized = CALIBRATION_DECAY * self.realized + realized

    @property
    def factor(self) -> float:
        return min(1.0, (self.realized + CALIBRATION_PRIOR) / (self.expected + CALIBRATION_PRIOR))


PRIOR_FORCED = 0.9  # grammar-forced drafts, before any was verified: the model almost always agrees
PRIOR_CROSS_REQUEST = 0.4  # other requests' outputs: below a request's own lookup until measured


@dataclass(frozen=True)
class StepTerms:
    """The fitted step cost's terms (the features of ``Speculator.features``), as plain numbers: the
    plan prices many drafts against one fit."""

    fixed: float
    per_token: float
    per_row: float
    per_length: float  # each distinct draft length in a step

    @classmethod
    def of(cls, cost: LinearCost) -> StepTerms:
        fixed, per_token, per_row, per_length = (float(c) for c in cost.coef)
        return cls(fixed, per_token, per_row, per_length)

    def time(self, tokens: int, rows: int) -> float:
        """Seconds for a step of ``tokens`` and ``rows`` sampled rows, without drafts."""
        return self.fixed + self.per_token * tokens + self.per_row * rows

    @property
    def per_draft(self) -> float:
        """What one more verified draft adds: a token and a sampled row."""
        return self.per_token + self.per_row


@dataclass(frozen=True)
class Candidate:
    """A decoding request that could speculate: one acceptance per draft it could get (its limit),
    and optionally per draft the ``Calibration.factor`` of its origin."""

    alphas: tuple[float, ...]
    factors: tuple[float, ...] = ()

    @classmethod
    def uniform(cls, limit: int, alpha: float) -> Candidate:
        return cls((alpha,) * limit)

    def gains(self, calibrated: bool = True) -> list[float]:
        """Expected tokens the j-th draft adds: the chance that it and every draft before it are
        accepted (times its factor, unless ``calibrated`` is False: the estimate before correction)."""
        out, p = [], 1.0
        for j, alpha in enumerate(self.alphas):
            p *= alpha
            out.append(p * self.factors[j] if calibrated and self.factors else p)
        return out


def plan_drafts(
    candidates: list[Candidate],
    base_tokens: int,
    base_rows: int,
    cost: LinearCost,
    draft_cost: float = 0.0,
) -> list[int]:
    """Drafts per candidate. ``base_tokens``/``base_rows``: what the step computes without drafts;
    ``draft_cost``: seconds a proposer spends per draft token (0 for a lookup)."""
    ks = [0] * len(candidates)
    if not candidates or not cost.ready:
        return ks
    gains = sorted(((g, i) for i, c in enumerate(candidates) for g in c.gains() if g > 0), reverse=True)
    terms = StepTerms.of(cost)
    base_time = terms.time(base_tokens, base_rows)
    if base_time <= 0:
        return ks
    per_draft = terms.per_draft + draft_cost  # the least one more draft adds to the step
    per_length = terms.per_length
    emitted = float(max(base_rows, 1))
    best_rate = emitted / base_time
    plain_rate = best_rate
    best_count = 0
    planned = [0] * len(candidates)
    lengths: Counter[int] = Counter()  # requests per draft count so far
    for count, (gain, i) in enumerate(gains, start=1):
        least_time = base_time + per_draft * (count - 1) + (per_length if count > 1 else 0.0)
        if gain <= best_rate * per_draft and emitted <= best_rate * least_time:
            # neither the plan so far (at the least time its drafts can cost) nor any later draft (no
            # larger gain, no smaller cost) beats the best rate, so no longer plan can: its rate is a
            # mediant of them
            break
        emitted += gain
        if planned[i]:
            lengths[planned[i]] -= 1
            if not lengths[planned[i]]:
                del lengths[planned[i]]
        planned[i] += 1
        lengths[planned[i]] += 1
        t = base_time + per_draft * count + per_length * len(lengths)
        if emitted / t > best_rate:
            best_rate, best_count = emitted / t, count
    if best_rate < plain_rate * (1.0 + MARGIN):
        return ks
    for _, i in gains[:best_count]:
        ks[i] += 1
    return ks
