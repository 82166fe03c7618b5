"""Request-level behaviour of the facade on the tiny preset: errors, sampling, stops, streaming."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=256)


def test_bad_inputs_become_error_outputs_and_others_finish(llm):
    prompts = ["a fine prompt", "", [1] * 300, "another fine prompt", "bad temperature", [10**6]]
    params = [SamplingParams(max_tokens=4)] * 4 + [SamplingParams(temperature=-1.0)] + [SamplingParams()]
    outs = llm.generate(prompts, params)
    assert [o.index for o in outs] == list(range(6))
    assert outs[0].finish_reason == "length" and outs[0].num_output_tokens == 4
    assert outs[3].finish_reason == "length"
    assert outs[1].finish_reason == "error" and "empty prompt" in outs[1].error
    assert outs[2].finish_reason == "error" and "300 tokens" in outs[2].error
    assert outs[4].finish_reason == "error" and "temperature" in outs[4].error
    assert outs[5].finish_reason == "error" and "vocabulary" in outs[5].error


def test_prompt_plus_max_tokens_over_limit_is_an_error(llm):
    out = llm.generate([[5] * 200], SamplingParams(max_tokens=100))[0]
    assert out.finish_reason == "error" and "max_tokens (100)" in out.error


@pytest.mark.parametrize(
    "params, word",
    [
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_k=-5), "top_k"),
        (SamplingParams(min_p=2.0), "min_p"),
        (SamplingParams(max_tokens=0), "max_tokens"),
        (SamplingParams(max_tokens=2, min_tokens=3), "min_tokens"),
        (SamplingParams(logprobs=99), "logprobs"),
        (SamplingParams(temperature=float("nan")), "temperature"),
        (SamplingParams(temperature=float("inf")), "temperature"),
        (SamplingParams(top_p=float("nan")), "top_p"),
    ],
)
def test_each_invalid_sampling_value_is_named(llm, params, word):
    out = llm.generate(["x y z"], params)[0]
    assert out.finish_reason == "error" and word in out.error


def test_default_params_have_no_small_cap(llm):
    out = llm.generate(["count"], SamplingParams(ignore_eos=True))[0]
    assert out.finish_reason == "length"
    assert out.num_prompt_tokens + out.num_output_tokens == llm.max_model_len


def test_seeded_request_same_alone_and_in_batch_of_32(llm):
    seeded = SamplingParams(temperature=1.0, top_k=50, top_p=0.9, seed=1234, max_tokens=16, ignore_eos=True)
    alone = llm.generate(["the seeded prompt"], seeded)[0].token_ids
    others = [f"other prompt number {i} " * (1 + i % 5) for i in range(32)]
    mixed = [SamplingParams(temperature=0.8, max_tokens=8 + i % 9, ignore_eos=True) for i in range(32)]
    batch = llm.generate(
        others[:16] + ["the seeded prompt"] + others[16:], mixed[:16] + [seeded] + mixed[16:]
    )
    assert batch[16].token_ids == alone
    unseeded = SamplingParams(temperature=1.0, max_tokens=16, ignore_eos=True, seed=99)
    assert llm.generate(["the seeded prompt"], unseeded)[0].token_ids != alone


def test_sampling_filters_restrict_tokens(llm):
    greedy = llm.generate(["filters"], SamplingParams(max_tokens=6, ignore_eos=True))[0].token_ids
    top1 = llm.generate(["filters"], SamplingParams(temperature=2.0, top_k=1, max_tokens=6, ignore_eos=True))[
        0
    ]
    tiny_p = llm.generate(
        ["filters"], SamplingParams(temperature=2.0, top_p=1e-6, max_tokens=6, ignore_eos=True)
    )[0]
    min_p = llm.generate(
        ["filters"], SamplingParams(temperature=2.0, min_p=1.0, max_tokens=6, ignore_eos=True)
    )[0]
    assert top1.token_ids == greedy and tiny_p.token_ids == greedy and min_p.token_ids == greedy


def test_stop_token_ids_and_strings(llm):
    base = llm.generate(["stops"], SamplingParams(max_tokens=12, ignore_eos=True))[0]
    stop_at = base.token_ids[4]
    first = base.token_ids.index(stop_at)
    by_id = llm.generate(["stops"], SamplingParams(max_tokens=12, stop_token_ids=[stop_at], ignore_eos=True))[
        0
    ]
    assert by_id.finish_reason == "stop" and by_id.stop_reason == stop_at
    assert by_id.token_ids == base.token_ids[: first + 1]
    text = base.text
    stop_str = text[len(text) // 2 : len(text) // 2 + 2]
    by_str = llm.generate(["stops"], SamplingParams(max_tokens=12, stop=[stop_str], ignore_eos=True))[0]
    assert by_str.finish_reason == "stop" and stop_str not in by_str.text
    assert text.startswith(by_str.text)


def test_min_tokens_blocks_eos(llm):
    eos = llm.engine.eos_ids[0]
    out = llm.generate(["eos test"], SamplingParams(max_tokens=8, min_tokens=8, stop_token_ids=[eos]))[0]
    assert out.num_output_tokens == 8 and eos not in out.token_ids[:-1]


def test_logprobs_of_sampled_and_top_alternatives(llm):
    out = llm.generate(["logprobs"], SamplingParams(max_tokens=5, logprobs=3, ignore_eos=True))[0]
    assert len(out.logprobs) == 5
    for token, position in zip(out.token_ids, out.logprobs):
        assert list(position)[0] == token and position[token].logprob <= 0.0
        assert len(position) == 3 and position[token].rank == 1  # greedy: the sampled token is the best
        values = [lp.logprob for lp in position.values()]
        assert values == sorted(values, reverse=True) and [lp.rank for lp in position.values()] == [1, 2, 3]


def test_stream_yields_every_request_once_with_stats(llm):
    before = llm.stats().output_tokens
    params = [SamplingParams(max_tokens=2 + 5 * (i % 2), ignore_eos=True) for i in range(10)]
    seen = [o.index for o in llm.generate_stream([f"stream {i}" for i in range(10)], params)]
    assert sorted(seen) == list(range(10))
    assert seen != sorted(seen) or len(set(p.max_tokens for p in params)) == 1  # short ones finish first
    assert llm.stats().output_tokens - before == sum(p.max_tokens for p in params)


def test_request_ids_and_timings(llm):
    outs = llm.generate(
        ["a", "b"], SamplingParams(max_tokens=3, ignore_eos=True), request_ids=["row-1", "row-2"]
    )
    assert [o.request_id for o in outs] == ["row-1", "row-2"]
    assert all(o.time_to_first_token is not None and o.latency >= o.time_to_first_token for o in outs)


def test_score_choices_equal_the_model_logprobs(llm):
    prompt_ids = llm.tokenizer.encode("score me please")
    first = llm.generate([prompt_ids], SamplingParams(max_tokens=1, logprobs=20, ignore_eos=True))[
        0
    ].logprobs[0]
    tok = llm.tokenizer
    top = [(t, lp.logprob) for t, lp in first.items()]
    clean = [(t, lp) for t, lp in top if tok.encode(tok.decode([t]), add_special_tokens=False) == [t]]
    assert len(clean) >= 2
    choices = [tok.decode([t]) for t, _ in clean]
    scores = llm.score_choices([prompt_ids], [choices])[0]
    assert scores == pytest.approx([lp for _, lp in clean], abs=1e-4)
    bad = llm.score_choices([prompt_ids, ""], [["x"], ["x"]])
    assert isinstance(bad[1], str) and "empty" in bad[1]


def test_unknown_option_and_bad_model_fail_fast():
    with pytest.raises(TypeError, match="unknown engine option"):
        LLM("tiny", max_batch=3)
    with pytest.raises(ValueError, match="not a directory, a .gguf file, a preset"):
        LLM("no-such-model")
    with pytest.raises(ValueError, match="ordering"):
        LLM("tiny", ordering="random")


def test_abandoned_stream_frees_blocks_and_does_not_leak_into_the_next_call(llm):
    stream = llm.generate_stream(
        [f"abandon {i}" for i in range(6)], SamplingParams(max_tokens=30, ignore_eos=True)
    )
    next(stream)
    stream.close()  # the caller stops early
    pool = llm.engine.kv.pool
    assert pool.num_free == len(pool.blocks) and not llm.engine.has_unfinished()
    outs = llm.generate(["fresh"], SamplingParams(max_tokens=2, ignore_eos=True), request_ids=["only"])
    assert [o.request_id for o in outs] == ["only"]


def test_empty_batch_and_tuple_prompts(llm):
    assert llm.generate([]) == []
    out = llm.generate([(5, 6, 7)], SamplingParams(max_tokens=2, ignore_eos=True))[0]
    assert out.prompt_token_ids == (5, 6, 7) and out.num_output_tokens == 2


def test_non_integer_token_ids_are_an_error(llm):
    outs = llm.generate([[1.5, 2], [True, 3], [4, 5]], SamplingParams(max_tokens=1))
    assert outs[0].finish_reason == "error" and "integers" in outs[0].error
    assert outs[1].finish_reason == "error"
    assert outs[2].finish_reason == "length"


def test_multi_token_choice_sums_per_token_logprobs(llm):
    tok = llm.tokenizer
    prompt_ids = tok.encode("score a longer choice")
    singles = [c for c in ("a", "b", "e", "s", "t", "1", "2", "x", ".", ",") if len(tok.encode(c)) == 1]
    pair = next(
        (c1, c2)
        for c1 in singles
        for c2 in singles
        if tok.encode(c1 + c2, add_special_tokens=False) == tok.encode(c1) + tok.encode(c2)
    )
    c1, c2 = pair
    first = llm.score_choices([prompt_ids], [[c1]])[0][0]
    second = llm.score_choices([prompt_ids + tok.encode(c1, add_special_tokens=False)], [[c2]])[0][0]
    both = llm.score_choices([prompt_ids], [[c1 + c2]])[0][0]
    assert both == pytest.approx(first + second, abs=1e-4)
    assert both < first  # a second token can only lower the joint probability


def test_score_choices_usage_shows_labels_sharing_the_prompt_blocks(llm):
    prompt = list(range(10, 60))  # 50 tokens: three full 16-token blocks the labels can share
    usage: list = []
    scores = llm.score_choices([prompt], [["a", "b", "c"]], usage=usage)
    assert len(scores[0]) == 3
    (use,) = usage
    assert use["tokens"] == sum(
        len(prompt) + len(llm.tokenizer.encode(c, add_special_tokens=False)) for c in "abc"
    )
    assert use["cached_tokens"] >= 2 * 48  # the second and third label hit the first one's blocks


def test_score_choices_usage_counts_each_choices_scored_tokens(llm):
    tok = llm.tokenizer
    choices = ["a", "a longer choice of several words", "b c"]
    usage: list = []
    llm.score_choices(["count the choice tokens", "x"], [choices, ["y", "zz top"]], usage=usage)
    assert usage[0]["choice_tokens"] == [len(tok.encode(c, add_special_tokens=False)) for c in choices]
    assert usage[1]["choice_tokens"] == [
        len(tok.encode(c, add_special_tokens=False)) for c in ("y", "zz top")
    ]
    assert usage[0]["choice_tokens"][1] > usage[0]["choice_tokens"][0] >= 1
