"""``SamplingParams.logit_bias`` (vLLM / OpenAI semantics) against transformers' own
``SequenceBiasLogitsProcessor``: the bias is added to the model's logits at every generated position,
before the grammar mask, penalties and temperature; ``processed`` log-probs include it, ``raw`` ones
do not; it never lets a grammar-disallowed token through; and speculative verification, which samples
every position with the plain sampler, draws the same tokens with it as speculation off."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from transformers import SequenceBiasLogitsProcessor, TemperatureLogitsWarper

from prefixflow.engine import LLM, SamplingParams, StructuredOutputs
from tests.engine.hf_models import random_prompts
from tests.engine.sampling.test_logprobs import _check_position, _engine, _hf_logits
from tests.engine.speculative.helpers import prompts as copy_prompts
from tests.engine.speculative.helpers import run as run_speculative

K = 4
NEW = 8


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(3, 6, 14, seed=11)


@pytest.fixture(scope="module")
def hf_model(llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def processed_llm(llama_dir):
    return _engine(llama_dir, "processed")


@pytest.fixture(scope="module")
def raw_llm(llama_dir):
    return _engine(llama_dir, "raw")


def _bias_for(hf_model, prompt: list[int]) -> dict[int, float]:
    """A bias that changes the greedy path: bans the model's first choice, lifts its 6th and 9th."""
    order = _hf_logits(hf_model, prompt)[-1].argsort(descending=True).tolist()
    return {order[0]: -100.0, order[5]: 4.5, order[8]: 2.0}


def _reference(hf_model, ids: list[int], position: int, bias: dict[int, float], temperature: float = 0.0):
    """transformers' processed distribution at ``position``: logits + bias (then temperature)."""
    row = _hf_logits(hf_model, ids)[position][None].clone()
    seen = torch.tensor([ids[: position + 1]])
    row = SequenceBiasLogitsProcessor([[[t], v] for t, v in bias.items()])(seen, row)
    if temperature:
        row = TemperatureLogitsWarper(temperature)(seen, row)
    return torch.log_softmax(row[0], dim=-1)


def test_greedy_follows_the_biased_logits_and_processed_logprobs_include_the_bias(
    processed_llm, hf_model, prompts
):
    tok = processed_llm.tokenizer
    biases = [_bias_for(hf_model, p) for p in prompts]
    params = [SamplingParams(max_tokens=NEW, ignore_eos=True, logprobs=K, logit_bias=b) for b in biases]
    plain = processed_llm.generate(prompts, SamplingParams(max_tokens=NEW, ignore_eos=True))
    outs = processed_llm.generate(prompts, params)
    for prompt, bias, out, unbiased in zip(prompts, biases, outs, plain):
        assert out.token_ids[0] != unbiased.token_ids[0]  # the bias changed the path
        ids = prompt + list(out.token_ids)
        for i, (token, position) in enumerate(zip(out.token_ids, out.logprobs)):
            reference = _reference(hf_model, ids, len(prompt) - 1 + i, bias)
            assert token == int(reference.argmax())
            _check_position(position, token, reference, tok, K)


def test_raw_logprobs_leave_the_bias_out(raw_llm, processed_llm, hf_model, prompts):
    bias = _bias_for(hf_model, prompts[0])
    params = SamplingParams(max_tokens=NEW, ignore_eos=True, logprobs=0, logit_bias=bias)
    (raw,) = raw_llm.generate(prompts[:1], params)
    (processed,) = processed_llm.generate(prompts[:1], params)
    assert raw.token_ids == processed.token_ids  # the mode changes what is reported, never the tokens
    ids = prompts[0] + list(raw.token_ids)
    logits = _hf_logits(hf_model, ids)
    for i, token in enumerate(raw.token_ids):
        expected = torch.log_softmax(logits[len(prompts[0]) - 1 + i], dim=-1)
        assert raw.logprobs[i][token].logprob == pytest.approx(float(expected[token]), abs=1e-4)


def test_seeded_sampling_draws_from_the_biased_tempered_distribution(processed_llm, hf_model, prompts):
    tok = processed_llm.tokenizer
    bias = _bias_for(hf_model, prompts[1])
    params = SamplingParams(
        max_tokens=NEW, ignore_eos=True, logprobs=K, temperature=0.8, seed=3, logit_bias=bias
    )
    (out,) = processed_llm.generate(prompts[1:2], params)
    ids = prompts[1] + list(out.token_ids)
    for i, (token, position) in enumerate(zip(out.token_ids, out.logprobs)):
        _check_position(
            position, token, _reference(hf_model, ids, len(prompts[1]) - 1 + i, bias, 0.8), tok, K
        )


def test_a_bias_stays_with_its_own_request_in_a_batch(processed_llm, hf_model, prompts):
    bias = _bias_for(hf_model, prompts[0])
    params = [SamplingParams(max_tokens=NEW, ignore_eos=True, logit_bias=bias)] + [
        SamplingParams(max_tokens=NEW, ignore_eos=True)
    ] * 2
    batch = processed_llm.generate(prompts, params)
    alone = [processed_llm.generate([p], q)[0] for p, q in zip(prompts, params)]
    assert [o.token_ids for o in batch] == [o.token_ids for o in alone]


@pytest.mark.parametrize(
    ("bias", "message"),
    [
        ({10**6: 1.0}, "outside the vocabulary"),
        ({-1: 1.0}, "non-negative integer token ids"),
        ({"5": 1.0}, "convert the keys with int()"),
        ({5: math.inf}, "finite numbers"),
        ({5: math.nan}, "finite numbers"),
        ({5: "high"}, "finite numbers"),
        ([(5, 1.0)], "must be a mapping"),
    ],
)
def test_bad_logit_bias_is_that_requests_error(processed_llm, prompts, bias, message):
    outs = processed_llm.generate(
        prompts[:2], [SamplingParams(max_tokens=2, logit_bias=bias), SamplingParams(max_tokens=2)]
    )
    assert outs[0].finish_reason == "error" and "logit_bias" in outs[0].error and message in outs[0].error
    assert outs[1].finish_reason != "error"


@pytest.fixture(scope="module")
def tiny():
    return LLM("tiny", max_model_len=256)


def test_bias_moves_a_constrained_choice_but_never_past_the_grammar(tiny):
    choices = ("alpha", "beta", "gamma")
    constraint = StructuredOutputs(choice=choices)
    prompt = ["pick one of the words"]
    (plain,) = tiny.generate(prompt, SamplingParams(max_tokens=8, structured=constraint))
    assert plain.text in choices
    tok = tiny.tokenizer
    other = next(c for c in choices if c != plain.text)
    first = tok.encode(other, add_special_tokens=False)[0]
    (moved,) = tiny.generate(
        prompt, SamplingParams(max_tokens=8, structured=constraint, logit_bias={first: 60.0})
    )
    assert moved.text == other
    outside = tok.encode(" zzz", add_special_tokens=False)[0]
    (kept,) = tiny.generate(
        prompt, SamplingParams(max_tokens=8, structured=constraint, logit_bias={outside: 100.0})
    )
    assert kept.text == plain.text  # a disallowed token stays disallowed, however large its bias


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SPEC_ENGINE = dict(dtype="float32", device="cpu", block_size=4, num_kv_blocks=2048)


def test_speculative_verification_applies_the_bias_at_every_position():
    """Greedy and seeded requests with a bias: the same tokens with speculation on and off, the bias
    visibly changes them, and drafts were accepted (verified runs of several positions took place)."""
    items = copy_prompts(6, seed=31)
    bias = {t: 3.0 for t in range(40, 400, 7)} | {t: -50.0 for t in range(0, 30)}
    params = [
        SamplingParams(
            max_tokens=32,
            ignore_eos=True,
            logit_bias=bias,
            **({"temperature": 0.7, "seed": 9 + i} if i % 2 else {}),
        )
        for i in range(len(items))
    ]
    unbiased = [dataclasses.replace(p, logit_bias=None) for p in params]
    off, _, _ = run_speculative("tiny", items, params, None, **SPEC_ENGINE)
    on, stats, _ = run_speculative("tiny", items, params, NGRAM, **SPEC_ENGINE)
    plain, _, _ = run_speculative("tiny", items, unbiased, None, **SPEC_ENGINE)
    assert on == off
    assert off != plain
    assert all(t >= 30 for tokens in on for t in tokens)  # the banned ids never appear
    assert stats.speculation["ngram"]["accepted"] > 0
