"""One request's bad values or failure never stops the engine (issue 10, defect 1).

Every SamplingParams field is validated against the model before a request is queued; whatever
still fails inside a step (sampling, the forward pass, the stop check) becomes that request's error
output while the rest of the batch completes exactly as it would alone.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prefixflow.engine import LLM, SamplingParams

GOOD = SamplingParams(max_tokens=4)
GOOD_PROMPT = "the good request"


@pytest.fixture(scope="module")
def llm():
    return LLM("tiny", max_model_len=48)


@pytest.fixture(scope="module")
def lone_good(llm):
    return llm.generate([GOOD_PROMPT], GOOD)[0]


def _same(a, b) -> bool:
    return (a.token_ids, a.text, a.finish_reason) == (b.token_ids, b.text, b.finish_reason)


def test_the_issues_repro_returns_an_error_output_and_keeps_the_good_request(llm):
    outs = llm.generate(
        ["a", "b"],
        [SamplingParams(max_tokens=4, min_tokens=2, stop_token_ids=[10**6]), SamplingParams(max_tokens=4)],
    )
    assert (
        outs[0].finish_reason == "error"
        and "stop_token_ids holds 1000000, outside the vocabulary" in outs[0].error
    )
    assert outs[1].finish_reason == "length" and outs[1].num_output_tokens == 4


def test_top_k_beyond_int64_keeps_every_token(llm):
    huge = llm.generate(["x"], SamplingParams(max_tokens=4, temperature=0.8, top_k=2**63, seed=3))[0]
    off = llm.generate(["x"], SamplingParams(max_tokens=4, temperature=0.8, top_k=0, seed=3))[0]
    assert huge.finish_reason == "length" and huge.token_ids == off.token_ids


@pytest.mark.parametrize(
    "params, message",
    [
        (SamplingParams(logprobs=True), "logprobs"),
        (SamplingParams(top_k=True), "top_k"),
        (SamplingParams(max_tokens=2.0), "max_tokens"),  # type: ignore[arg-type]
        (SamplingParams(stop=5), "stop must be"),  # type: ignore[arg-type]
        (SamplingParams(stop_token_ids=7), "stop_token_ids must be a list"),  # type: ignore[arg-type]
        (SamplingParams(ignore_eos="yes"), "ignore_eos must be true or false"),  # type: ignore[arg-type]
        ({"temperature": 0.5}, "params must be a SamplingParams, got dict"),
    ],
)
def test_values_of_the_wrong_type_are_named(llm, params, message):
    bad, good = llm.generate(["bad", GOOD_PROMPT], [params, GOOD])
    assert bad.finish_reason == "error" and message in bad.error
    assert good.finish_reason == "length"


def _any_value() -> st.SearchStrategy[object]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(min_value=-(2**70), max_value=2**70),
        st.integers(min_value=-2, max_value=600),
        st.floats(allow_nan=True, allow_infinity=True),
        st.floats(min_value=0.0, max_value=2.0),
        st.text(max_size=4),
        st.lists(st.integers(min_value=-5, max_value=2**64), max_size=3),
        st.lists(st.text(max_size=3), max_size=2),
    )


# Valid values at the edges of each field's range (and a few just outside); every example also
# replaces up to two fields with anything at all.
EDGES = {
    "temperature": st.sampled_from([0.0, 1e-300, 1e-6, 1e-5, 0.7, 1.0, 100.0, 1e300]),
    "top_k": st.sampled_from([0, -1, 1, 2, 511, 512, 513, 2**63, 2**64]),
    "top_p": st.sampled_from([1.0, 0.5, 1e-9, 5e-324]),
    "min_p": st.sampled_from([0.0, 0.5, 1.0, 5e-324]),
    "seed": st.sampled_from([None, 0, -1, 2**63, 2**64 + 5, -(2**80)]),
    "max_tokens": st.sampled_from([None, 1, 3, 20, 10**9]),
    "min_tokens": st.sampled_from([0, 1, 3, 2**63]),
    "stop": st.sampled_from([None, "a", "e", ("b", "\x00"), ["zz"]]),
    "stop_token_ids": st.sampled_from([(), [0], [1, 2], [511], [512], [10**6], [2**63]]),
    "ignore_eos": st.booleans(),
    "logprobs": st.sampled_from([None, 0, 1, 5, 20, 21]),
    "include_stop_str_in_output": st.booleans(),
    "skip_special_tokens": st.booleans(),
}


@st.composite
def fuzzed_fields(draw: st.DrawFn) -> dict[str, object]:
    fields: dict[str, object] = draw(st.fixed_dictionaries({}, optional=EDGES))
    for name in draw(st.lists(st.sampled_from(sorted(EDGES)), max_size=2, unique=True)):
        fields[name] = draw(_any_value())
    return fields


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(fields=fuzzed_fields())
def test_fuzzed_sampling_params_never_raise_and_never_touch_the_good_request(llm, lone_good, fields):
    params = SamplingParams(**fields)  # type: ignore[arg-type]
    fuzzed, good = llm.generate(["a fuzzed request", GOOD_PROMPT], [params, GOOD])
    assert _same(good, lone_good)
    expected_error = params.validation_error(llm.engine.model_cfg.vocab_size)
    if expected_error is not None:
        assert fuzzed.finish_reason == "error" and expected_error in fuzzed.error
        return
    too_long = (
        params.max_tokens is not None and fuzzed.num_prompt_tokens + params.max_tokens > llm.max_model_len
    )
    if too_long:
        assert fuzzed.finish_reason == "error" and "exceeds max_model_len" in fuzzed.error
        return
    assert fuzzed.finish_reason in ("stop", "length"), fuzzed.error
    assert all(0 <= t < llm.engine.model_cfg.vocab_size for t in fuzzed.token_ids)
    limit = params.max_tokens if params.max_tokens is not None else llm.max_model_len
    assert fuzzed.num_output_tokens <= limit
    if params.logprobs is not None:
        assert fuzzed.logprobs is not None and len(fuzzed.logprobs) == fuzzed.num_output_tokens
        for token, position in zip(fuzzed.token_ids, fuzzed.logprobs):
            assert math.isfinite(position[token].logprob) or position[token].logprob == -math.inf
    assert not llm.engine.has_unfinished()


POISON = 77  # a token id the injected fault below refuses


def _poisoned_forward(model, monkeypatch):
    real = type(model).forward

    def forward(self, input_ids, ctx, kv_caches):  # type: ignore[no-untyped-def]
        if bool((input_ids == POISON).any()):
            raise RuntimeError("injected fault")
        return real(self, input_ids, ctx, kv_caches)

    monkeypatch.setattr(type(model), "forward", forward)


def test_a_forward_failure_of_one_request_is_its_error_and_the_batch_completes(llm, monkeypatch):
    prompts = [[5, 6, 7, 8], [9, 10, POISON, 11], [12, 13, 14]]
    lone = [llm.generate([p], GOOD)[0] for p in (prompts[0], prompts[2])]
    _poisoned_forward(llm.engine.runner.shard.model, monkeypatch)
    outs = llm.generate(prompts, GOOD)
    assert (
        outs[1].finish_reason == "error"
        and "model step failed" in outs[1].error
        and "injected" in outs[1].error
    )
    assert _same(outs[0], lone[0]) and _same(outs[2], lone[1])
    assert not llm.engine.has_unfinished()


def test_a_failure_no_request_explains_is_raised_not_turned_into_error_rows(llm, monkeypatch):
    """When every request fails alone too (device fault, out of memory), an error row per request
    would be committed as a final result; the engine raises instead, so a job stops and resumes."""
    _poisoned_forward(llm.engine.runner.shard.model, monkeypatch)
    with pytest.raises(RuntimeError, match="injected fault"):
        llm.generate([[POISON, 1], [2, POISON]], GOOD)
    pool = llm.engine.kv.pool
    assert not llm.engine.has_unfinished() and pool.num_free == len(pool.blocks)


def test_a_sampling_failure_of_one_request_is_its_error(llm, monkeypatch):
    from prefixflow.engine.sampling import sampler

    real = sampler.sample

    def sample(logits, requests, *args):  # type: ignore[no-untyped-def]
        if any(r.params.seed == 666 for r in requests):
            raise IndexError("injected sampling fault")
        return real(logits, requests, *args)

    monkeypatch.setattr(sampler, "sample", sample)
    cursed = SamplingParams(max_tokens=4, temperature=1.0, seed=666)
    outs = llm.generate(["cursed", GOOD_PROMPT, "fine too"], [cursed, GOOD, GOOD])
    assert outs[0].finish_reason == "error" and "sampling failed" in outs[0].error
    assert outs[1].finish_reason == "length" and outs[2].finish_reason == "length"


def test_a_stop_check_failure_of_one_request_is_its_error(llm, monkeypatch):
    checker = llm.engine.stop_checker
    real = checker.check

    def check(req):  # type: ignore[no-untyped-def]
        if req.request_id == "doomed":
            raise UnicodeDecodeError("utf-8", b"\xff", 0, 1, "injected")
        return real(req)

    monkeypatch.setattr(checker, "check", check)
    outs = llm.generate(["x", GOOD_PROMPT], GOOD, request_ids=["doomed", "fine"])
    assert outs[0].finish_reason == "error" and "stop check failed" in outs[0].error
    assert outs[1].finish_reason == "length"
