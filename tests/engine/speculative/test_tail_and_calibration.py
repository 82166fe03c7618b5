"""``auto`` in a job's tail (no request waiting) and its calibration against realized acceptance:
the chance of finishing last against a simulation, the worths it gives, the plan's early stop against
the exhaustive plan, the cost fit against numpy's solve, and greedy identity with all of it on."""

from __future__ import annotations

import random

import numpy as np
import pytest

from prefixflow.engine import SamplingParams
from prefixflow.engine.speculative.cost_model import DECAY, RIDGE, LinearCost
from prefixflow.engine.speculative.decoder import RequestSpecState
from prefixflow.engine.speculative.policy import MARGIN, Acceptance, Calibration, Candidate, plan_drafts
from prefixflow.engine.speculative.runs import CROSS_REQUEST
from prefixflow.engine.speculative.tail import last_chances, tail_worths, tie_weight
from tests.engine.speculative.helpers import AUTO_NGRAM, prompts, run


@pytest.mark.parametrize("shared", [1.0, 0.0])
@pytest.mark.parametrize("seed", range(6))
def test_last_chances_match_a_simulation(seed, shared):
    """Shared (1): a tie for last is split among its requests; strict (0): only a request that ends
    after every other one is last. Half the seeds put several requests on the largest budget."""
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 7))
    budgets = rng.integers(5, 120, n).astype(float)
    if seed % 2:
        budgets[: n // 2 + 1] = budgets.max()
    hazard = float(rng.choice([0.005, 0.03, 0.1]))
    chances = last_chances(budgets, hazard, shared)
    draws = 40_000
    steps = np.minimum(rng.exponential(1.0 / hazard, (draws, n)), budgets)
    if shared:
        steps += rng.random(steps.shape) * 1e-9  # two outputs that both reach equal budgets: a tie, shared
        simulated = np.bincount(steps.argmax(axis=1), minlength=n) / draws
        assert chances.sum() == pytest.approx(1.0)
    else:
        ordered = np.sort(steps, axis=1)
        alone = ordered[:, -1] > ordered[:, -2]  # a tie at the end is nobody's
        simulated = np.bincount(steps.argmax(axis=1)[alone], minlength=n) / draws
        assert chances.sum() == pytest.approx(alone.mean(), abs=0.02)
    assert np.abs(chances - simulated).max() < 0.02, (chances, simulated)  # exact, less sampling noise


def test_a_request_with_the_most_left_is_last():
    """Nearly no stops (outputs run to their budget): the request with the most left is last, and
    requests on equal budgets tie: shared, each has its share; strict, none is last."""
    chances = last_chances(np.array([90.0, 60.0, 40.0]), 1e-6)
    assert chances[0] > 0.95 and chances[1] < 0.03 and chances[2] < 0.03
    assert last_chances(np.array([50.0] * 4), 0.02) == pytest.approx([0.25] * 4)
    assert last_chances(np.array([50.0] * 4), 1e-6, 0.0) == pytest.approx([0.0] * 4, abs=1e-3)
    blended = last_chances(np.array([50.0] * 4), 1e-6, 0.5)
    assert blended == pytest.approx([0.125] * 4, abs=1e-3)


def test_a_tie_is_shared_until_stops_are_seen():
    assert tie_weight(0) == 1.0
    weights = [tie_weight(stops) for stops in (0, 1, 2, 8, 100)]
    assert weights == sorted(weights, reverse=True) and weights[-1] < 0.05
    assert tie_weight(50, float("inf")) == 1.0


def test_tail_worths_are_one_with_equal_chances_and_a_row_without_a_chance():
    fixed, per_row, rows = 0.020, 0.001, 4
    step = fixed + per_row * rows
    even = tail_worths(np.array([60.0] * rows), 0.02, fixed, per_row, step, rows)
    assert even == pytest.approx([1.0] * rows)
    skewed = tail_worths(np.array([90.0, 30.0, 30.0, 30.0]), 1e-6, fixed, per_row, step, rows)
    # nearly all of the step's fixed cost rides on the one with the most left
    assert skewed[0] == pytest.approx((per_row + fixed) * rows / step, rel=1e-3)
    assert skewed[1:] == pytest.approx([per_row * rows / step] * 3, rel=0.05)  # only the row it frees
    # four requests that all run to one budget: with the tie nobody's, each draft frees only a row
    tied = tail_worths(np.array([60.0] * rows), 1e-6, fixed, per_row, step, rows, shared_ties=0.0)
    assert tied == pytest.approx([per_row * rows / step] * rows, rel=0.01)


def exhaustive_plan(
    candidates: list[Candidate], base_tokens: int, base_rows: int, cost: LinearCost
) -> list[int]:
    """The plan without the early stop: every prefix of the best-first drafts is priced."""
    gains = sorted(((g, i) for i, c in enumerate(candidates) for g in c.gains() if g > 0), reverse=True)
    base = cost.predict([base_tokens, base_rows, 0.0])
    emitted, plain = float(base_rows), base_rows / base
    best, best_count, planned = plain, 0, [0] * len(candidates)
    for count, (gain, i) in enumerate(gains, start=1):
        emitted += gain
        planned[i] += 1
        lengths = len({k for k in planned if k})
        rate = emitted / cost.predict([base_tokens + count, base_rows + count, lengths])
        if rate > best:
            best, best_count = rate, count
    ks = [0] * len(candidates)
    if best >= plain * (1.0 + MARGIN):
        for _, i in gains[:best_count]:
            ks[i] += 1
    return ks


@pytest.mark.parametrize("seed", range(60))
def test_plan_stops_early_only_where_no_longer_plan_wins(seed):
    """Including steps where a new draft length costs much (a longer plan can then cost less per
    draft, when it merges two lengths into one)."""
    rng = random.Random(seed)
    cost = LinearCost(3)
    fixed, per_token, per_length = rng.uniform(0.001, 0.05), rng.uniform(1e-4, 2e-3), rng.uniform(0, 0.05)
    for _ in range(40):
        tokens, lengths = rng.randrange(1, 300), rng.randrange(0, 4)
        cost.observe([tokens, tokens * 0.8, lengths], fixed + per_token * tokens + per_length * lengths)
    rows = rng.choice([1, 2, 3, 16, 64])
    candidates = [
        Candidate(
            tuple(rng.uniform(0.0, 1.0) for _ in range(rng.randrange(0, 6))),
            (rng.uniform(0.3, 1.5),) * 5 if seed % 2 else (),
        )
        for _ in range(rows)
    ]
    assert plan_drafts(candidates, rows, rows, cost) == exhaustive_plan(candidates, rows, rows, cost)


def test_cost_fit_solves_the_same_ridge_equations_as_numpy():
    rng = np.random.default_rng(3)
    cost = LinearCost(3)
    xtx, xty = np.zeros((4, 4)), np.zeros(4)
    for _ in range(30):
        x = np.array([1.0, rng.integers(1, 400), rng.integers(1, 64), rng.integers(0, 4)], dtype=float)
        y = 0.01 + 1e-4 * x[1] + 6e-4 * x[2] + 1e-3 * x[3] + rng.normal() * 1e-4
        cost.observe(list(x[1:]), float(y))
        xtx, xty = DECAY * xtx + np.outer(x, x), DECAY * xty + y * x
    ridge = np.diag(RIDGE * np.diag(xtx))
    ridge[0, 0] = 0.0
    expected = np.maximum(np.linalg.solve(xtx + ridge + 1e-12 * np.eye(4), xty), 0.0)
    assert np.allclose(cost.coef, expected, rtol=1e-8, atol=1e-12)


def test_calibration_shrinks_only_the_origin_that_fell_short():
    own, cross = Calibration(), Calibration()
    state = RequestSpecState(None, calibration={None: own, CROSS_REQUEST: cross})
    for _ in range(40):
        state.planned = [0.9, 0.8, 0.7, 0.6]  # two own drafts, then two from the pool
        state.observe([None, None, CROSS_REQUEST, CROSS_REQUEST], accepted=2)  # the pool's both rejected
    assert own.factor == 1.0  # met its expectation (capped: never raised)
    assert cross.factor < 0.2
    assert not state.planned  # consumed by the run it priced
    assert Calibration().factor == 1.0


def test_calibration_cuts_a_plan_that_looked_profitable():
    cost = LinearCost(3)
    for tokens in range(1, 40):
        cost.observe([float(tokens), float(tokens), 0.0], 0.010 + 0.001 * tokens)
    trusted = Candidate.uniform(4, 0.7)
    assert sum(plan_drafts([trusted] * 16, 16, 16, cost)) > 0
    assert plan_drafts([Candidate((0.7,) * 4, (0.3,) * 4)] * 16, 16, 16, cost) == [0] * 16


GREEDY = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
ENGINE = dict(dtype="float32", device="cpu", block_size=4, num_kv_blocks=2048)


def test_auto_in_the_tail_is_greedy_identical_and_prices_by_chance_to_finish_last():
    """All prompts fit one batch, so nothing waits: the tail's worths are computed and used."""
    items = prompts(12, seed=4)
    off, _, _ = run("tiny", items, GREEDY, None, **ENGINE)
    on, _, llm = run("tiny", items, GREEDY, AUTO_NGRAM, **ENGINE)
    assert on == off
    speculator = llm.engine.speculator
    assert speculator.tail and all(w >= 0 for w in speculator.tail.values())
    assert speculator.finished_tokens == 12 * 40 and speculator.ended == 0  # ignore_eos: all ran to length


def test_caution_discounts_a_record_above_the_prior_never_below_it():
    assert Acceptance().cautious_rate(0.33) == pytest.approx(0.33)  # no record: the prior itself
    good = Acceptance(proposed=6, accepted=6)
    assert 0.33 < good.cautious_rate(0.33) < good.rate(0.33)  # part of the record is luck
    strong = Acceptance(proposed=600, accepted=540)
    assert strong.cautious_rate(0.33) == pytest.approx(strong.rate(0.33), abs=0.02)  # little is
    poor = Acceptance(proposed=10, accepted=1)
    assert poor.cautious_rate(0.5) == pytest.approx(poor.rate(0.5))  # not picked: its own rate
