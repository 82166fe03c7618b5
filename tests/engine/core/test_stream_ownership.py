"""Each generate_stream / generate / score_choices call owns its requests: streams on one LLM read in
any interleaving yield exactly their own outputs, equal to a lone call, and closing one stream aborts
only its own requests (issue 10, defect 2)."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams

PARAMS = SamplingParams(max_tokens=6, ignore_eos=True)
A = ["a0 the first stream", "a1 the first stream again", "a2 the first stream, third prompt"]
B = ["b0 second", "b1 second stream", "b2 second stream, last one"]


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=128, max_num_seqs=1)  # the repro: one request at a time


def outputs(stream) -> list[tuple[str, tuple[int, ...]]]:
    return sorted((o.request_id, o.token_ids) for o in stream)


def test_alternately_read_streams_each_get_exactly_their_own_outputs(llm):
    lone_a = outputs(llm.generate(A, PARAMS, request_ids=["a0", "a1", "a2"]))
    lone_b = outputs(llm.generate(B, PARAMS, request_ids=["b0", "b1", "b2"]))
    sa = llm.generate_stream(A, PARAMS, request_ids=["a0", "a1", "a2"])
    sb = llm.generate_stream(B, PARAMS, request_ids=["b0", "b1", "b2"])
    got_a, got_b = [], []
    for _ in range(3):
        got_a.append(next(sa))
        got_b.append(next(sb))
    for stream in (sa, sb):
        with pytest.raises(StopIteration):
            next(stream)
    assert outputs(got_a) == lone_a and outputs(got_b) == lone_b
    assert not llm.engine.has_unfinished()


def test_same_request_ids_in_two_streams_do_not_collide(llm):
    lone = outputs(llm.generate(A[:2], PARAMS))
    s1, s2 = llm.generate_stream(A[:2], PARAMS), llm.generate_stream(A[:2], PARAMS)  # both "0", "1"
    got1, got2 = [next(s1)], [next(s2)]
    got2 += list(s2)
    got1 += list(s1)
    assert outputs(got1) == outputs(got2) == lone


def test_closing_one_stream_aborts_only_its_requests(llm):
    lone_b = outputs(llm.generate(B, PARAMS, request_ids=["b0", "b1", "b2"]))
    sa = llm.generate_stream(A, PARAMS, request_ids=["a0", "a1", "a2"])
    sb = llm.generate_stream(B, PARAMS, request_ids=["b0", "b1", "b2"])
    next(sa)
    first_b = next(sb)
    sa.close()
    assert outputs([first_b, *sb]) == lone_b
    pool = llm.engine.kv.pool
    assert not llm.engine.has_unfinished() and pool.num_free == len(pool.blocks)


def test_scoring_between_stream_reads_keeps_both_results(llm):
    lone_scores = llm.score_choices(["is it good?"], [["yes", "no"]])
    lone_a = outputs(llm.generate(A, PARAMS, request_ids=["a0", "a1", "a2"]))
    sa = llm.generate_stream(A, PARAMS, request_ids=["a0", "a1", "a2"])
    got = [next(sa)]
    scores = llm.score_choices(["is it good?"], [["yes", "no"]])  # steps the engine; A's outputs wait
    got += list(sa)
    assert scores[0] == pytest.approx(lone_scores[0], abs=1e-5)
    assert outputs(got) == lone_a
