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

Every request is taken to advance one token per step. Weighting by each request's measured tokens per
step was tried and measured worse (summaries at batch 8 over 32 rows: 182 steps against 176, 1.19x off
against 1.21x over 5 interleaved repeats, RESULTS issue 27): the requests whose drafts were accepted
looked fast, so unlikely to be last, and lost the drafts that made them fast; speed follows from the
drafts granted, and cannot also decide them.
"""

from __future__ import annotations

import numpy as np

GRID = 32  # points in time at which the chances are evaluated
REFRESH_STEPS = 4  # the chances move slowly: recomputed every few steps (and for a new request)


def last_chances(budgets: np.ndarray, hazard: float) -> np.ndarray:
    """Per request, the chance that it finishes after every other one.

    ``budgets``: tokens each may still produce; ``hazard``: the chance that a token ends its output.
    Each request's remaining tokens are ``min(N, budget)`` with ``N`` exponential of rate ``hazard``;
    the chances are normalised to sum to 1 (ties share)."""
    n = len(budgets)
    if n == 0:
        return np.zeros(0)
    ends = np.maximum(budgets, 1.0)  # the token by which each must have ended
    times = np.linspace(0.0, float(ends.max()), GRID + 1)[1:]
    cdf = np.where(
        times[None, :] >= ends[:, None] - 1e-9, 1.0, -np.expm1(-max(hazard, 1e-9) * times[None, :])
    )
    cdf = np.maximum(cdf, 1e-300)
    ends_at = np.diff(cdf, axis=1, prepend=0.0)  # chance of ending within each interval
    others_done = np.exp(np.log(cdf).sum(axis=0)[None, :] - np.log(cdf))  # every other one by then
    chances = (ends_at * others_done).sum(axis=1)
    total = chances.sum()
    return chances / total if total > 0 else np.full(n, 1.0 / n)


def tail_worths(
    budgets: np.ndarray,
    hazard: float,
    fixed: float,
    per_row: float,
    step_time: float,
    rows: int,
) -> np.ndarray:
    """Per request, what an accepted draft saves in the tail, relative to what ``plan_drafts``
    assumes (``step_time / rows``): ``(per_row + chance_last * fixed) / (step_time / rows)``. With
    equal chances it is 1; a request that will not be last is worth only the row it frees."""
    if step_time <= 0 or rows <= 0:
        return np.ones(len(budgets))
    chances = last_chances(budgets, hazard)
    return (per_row + chances * fixed) * rows / step_time
