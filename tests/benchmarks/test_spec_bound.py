"""The speculation bound's replay, hand-counted: drafts per step, oracle cuts, steps and priced time."""

from __future__ import annotations

import pytest

from benchmarks.spec_bound import Plan, replay, replay_request
from prefixflow.engine.speculative.output_pool import OutputPool
from prefixflow.engine.speculative.policy import StepTerms

PROMPT = [1, 2, 3, 4, 5, 6]
OUTPUT = [1, 2, 3, 9, 8, 7]  # after "1 2" the prompt continues "3 4 5": the target takes "3" only


def pool() -> OutputPool:
    return OutputPool(2, 5, 256, 0.5)


def test_every_proposal_verifies_the_whole_draft_and_the_oracle_only_what_is_accepted() -> None:
    # step 1 (after "1"): no earlier "6 1"; step 2 (after "1 2"): drafts "3 4 5" (3 left), "3" accepted
    # and "9" sampled; steps 3 and 4 (after "3 9", "9 8"): nothing seen before
    assert replay_request(PROMPT, OUTPUT, pool(), 2, 5, Plan("every", 8)) == [0, 3, 0, 0]
    assert replay_request(PROMPT, OUTPUT, pool(), 2, 5, Plan("oracle", 8, oracle=True)) == [0, 1, 0, 0]
    assert replay_request(PROMPT, OUTPUT, pool(), 2, 5, Plan("k=2", 2)) == [0, 2, 0, 0]
    assert replay_request(PROMPT, OUTPUT, pool(), 2, 5, Plan("off", 0, draft=False)) == [0] * 5


def test_static_batches_end_with_their_longest_request_and_are_priced_per_step() -> None:
    terms = StepTerms(fixed=1.0, per_token=0.1, per_row=0.01, per_length=0.0)
    outputs = [(PROMPT, OUTPUT), (PROMPT, [5, 6])]  # the second needs one decode step
    steps, seconds = replay(outputs, 2, Plan("off", 0, draft=False), terms)
    assert steps == 5
    # 1 step of 2 rows, then 4 of 1 row: each row a token and a sampled row
    assert seconds == pytest.approx(1 * (1 + 2 * 0.11) + 4 * (1 + 0.11))
    steps, seconds = replay(outputs, 2, Plan("oracle", 8, oracle=True), terms)
    assert steps == 4  # the accepted "3" saves one
    assert seconds == pytest.approx((1 + 2 * 0.11) + (1 + 2 * 0.11) + 2 * (1 + 0.11))
