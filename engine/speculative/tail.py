"""The tail of a job: what an accepted draft is worth when no request is waiting.

While requests wait, a request that finishes early frees its slot for the next one, so every token a
draft saves is worth a share of a step: ``t / rows``, which is what ``plan_drafts`` assumes. When the
queue is empty, the running requests are the rest of the job, and it ends when the last of them does.
A token saved on a request that would not have been last only removes one row from a later step
(``per_row``); only the last request's tokens also save the step's fixed cost. Without this, a static
batch of chat prompts spent rows drafting for the requests that copy (they finish early anyway) while
the job waited on those that run to ``max_tokens`` (batch 64: ``auto`` 0.96x off, RESULTS issue 27).

Which request ends last is not known, so each gets its chance: its output ends by a stop with a
per-token hazard (the engine's measured rate of stops per generated token) or at its token budget.
Requests that run to equal budgets tie for last, and a draft for one of a tie saves no step: such a
tie is nobody's, once the stops seen make the hazard that predicts it trustworthy (``tie_weight``).

Every request is taken to advance one token per step. Weighting by each request's measured tokens per
step was tried and measured worse (summaries at batch 8 over 32 rows: 182 steps against 176, 1.19x off
against 1.21x over 5 interleaved repeats, RESULTS issue 27): the requests whose drafts were accepted
looked fast, so unlikely to be last, and lost the drafts that made them fast; speed follows from the
drafts granted, and cannot also decide them.
"""

from __future__ import annotations

import numpy as np

REFRESH_STEPS = 4  # the chances move slowly: recomputed every few steps (and for a new request)
TIE_PRIOR_STOPS = 2.0  # stops seen before a predicted tie counts as half nobody's (``tie_weight``)


def tie_weight(stops_seen: int, prior_stops: float = TIE_PRIOR_STOPS) -> float:
    """How much of a predicted tie at the end is shared among its requests rather than nobody's.

    A tie at the end (several requests run to equal budgets) is nobody's: a draft for one of them
    saves no step. But the tie is predicted from the measured stop hazard, and before the engine has
    seen stops that hazard is only its prior, which reads nearly every first batch as one tie (the
    first batch of summaries, 8 requests: the strict chances summed to 0.007 after 10 steps, and
    ``auto`` priced every draft at a row). So the tie is shared while stops are few, and counted as
    nobody's as they accumulate."""
    return 1.0 / (1.0 + max(stops_seen, 0) / prior_stops)  # an infinite prior: always shared


def last_chances(budgets: np.ndarray, hazard: float, shared_ties: float = 1.0) -> np.ndarray:
    """Per request, the chance that the job ends with it: that it finishes after every other one.

    ``budgets``: tokens each may still produce; ``hazard``: the chance that a token ends its output.
    Each request's remaining tokens are ``min(N, budget)`` with ``N`` exponential of rate ``hazard``.
    ``shared_ties`` in [0, 1] blends two readings of a tie for last (several requests reaching one
    budget after every other request ended): 1, each request of the tie gets an equal share (the
    chances sum to 1); 0, a tie is nobody's (they sum to 1 less the chance of a tie).

    Exact, in closed form: every request has the same ``u(t) = 1 - exp(-hazard t)``, the chance of a
    stop by ``t``. Between two adjacent budget levels, request i stops at t while the ``m`` others
    that have not reached a budget all stopped before: the integral of ``u^m du``, so
    ``(u_hi^(m+1) - u_lo^(m+1)) / (m+1)``. At its budget ``b``, with ``n_b`` requests on that budget
    and ``r`` on larger ones (all of whom must have stopped by then): alone ``(1 - u) u^(n_b - 1 + r)``;
    sharing every tie of that level ``u^r (1 - u^n_b) / n_b``."""
    n = len(budgets)
    if n == 0:
        return np.zeros(0)
    ends = np.maximum(np.asarray(budgets, dtype=float), 1.0)  # the token by which each must have ended
    levels, at_level = np.unique(ends, return_counts=True)
    u = -np.expm1(-max(hazard, 1e-9) * levels)  # a stop before each level
    reaching = n - np.concatenate(([0], np.cumsum(at_level)[:-1]))  # requests whose budget is >= the level
    below = np.concatenate(([0.0], u[:-1]))
    stops = np.cumsum((u**reaching - below**reaching) / reaching)  # stopping last, through each level
    higher = reaching - at_level  # requests on larger budgets
    alone = (1.0 - u) * u ** (at_level - 1 + higher)
    shared = u**higher * (1.0 - u**at_level) / at_level
    level = np.searchsorted(levels, ends)
    chances: np.ndarray = stops[level] + (shared_ties * shared + (1.0 - shared_ties) * alone)[level]
    return chances


def tail_worths(
    budgets: np.ndarray,
    hazard: float,
    fixed: float,
    per_row: float,
    step_time: float,
    rows: int,
    shared_ties: float = 1.0,
) -> np.ndarray:
    """Per request, what an accepted draft saves in the tail, relative to what ``plan_drafts``
    assumes (``step_time / rows``): ``(per_row + chance_last * fixed) / (step_time / rows)``. With
    equal chances and ties shared it is 1; a request that will not be last, or will at best tie, is
    worth only the row it frees."""
    if step_time <= 0 or rows <= 0:
        return np.ones(len(budgets))
    chances = last_chances(budgets, hazard, shared_ties)
    return (per_row + chances * fixed) * rows / step_time
