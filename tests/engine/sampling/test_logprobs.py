"""Log-probs as vLLM returns them, checked against transformers' logits: per position a dict token id ->
``Logprob(logprob, rank, decoded_token)``; ``logprobs_mode="raw"`` (default) is the model's own
distribution, ``"processed"`` the one the token was drawn from (penalties, temperature, top-k);
``prompt_logprobs`` the same for the prompt."""

from __future__ import annotations

import pytest
import torch
from transformers import RepetitionPenaltyLogitsProcessor, TemperatureLogitsWarper, TopKLogitsWarper

from prefixflow.engine import LLM, EngineConfig, Logprob, SamplingParams
from tests.engine.hf_models import random_prompts

K = 5
NEW = 10


@pytest.fixture(scope="module")
def prompts():
    return random_prompts(3, 6, 14, seed=3)


@pytest.fixture(scope="module")
def hf_model(llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32).eval()


def _engine(llama_dir, mode: str) -> LLM:
    return LLM(
        str(llama_dir), dtype="float32", device="cpu", max_num_seqs=8, block_size=8, logprobs_mode=mode
    )


@pytest.fixture(scope="module")
def raw_llm(llama_dir):
    return _engine(llama_dir, "raw")


@pytest.fixture(scope="module")
def processed_llm(llama_dir):
    return _engine(llama_dir, "processed")


@torch.inference_mode()
def _hf_logits(model, ids: list[int]) -> torch.Tensor:
    """transformers' logits at every position of ``ids``: row q predicts token q + 1."""
    return model(torch.tensor([ids])).logits[0].float()


def _check_position(position: dict, token: int, reference: torch.Tensor, tok, k: int) -> None:
    """``reference`` is the expected log-softmax row; the dict holds the token first, then the top k."""
    assert list(position)[0] == token
    assert all(isinstance(v, Logprob) for v in position.values())
    assert position[token].logprob == pytest.approx(float(reference[token]), abs=1e-4)
    assert position[token].rank == 1 + int((reference > reference[token] + 1e-6).sum())
    assert position[token].decoded_token == tok.decode([token])
    top = reference.topk(k)
    assert set(top.indices.tolist()) <= set(position) and len(position) in (k, k + 1)
    for rank, (t, value) in enumerate(zip(top.indices.tolist(), top.values.tolist()), start=1):
        assert position[t].logprob == pytest.approx(value, abs=1e-4)
        assert position[t].rank == rank or t == token


def test_raw_logprobs_are_the_models_distribution_despite_penalties(raw_llm, hf_model, prompts):
    """Today's main returned the penalized distribution (and a tuple, so ``logprobs[0][id]`` raised)."""
    params = SamplingParams(max_tokens=NEW, ignore_eos=True, logprobs=K, repetition_penalty=1.3)
    tok = raw_llm.tokenizer
    for prompt, out in zip(prompts, raw_llm.generate(prompts, params)):
        ids = prompt + list(out.token_ids)
        logits = _hf_logits(hf_model, ids)
        assert len(out.outputs[0].logprobs) == NEW
        for i, (token, position) in enumerate(zip(out.token_ids, out.outputs[0].logprobs)):
            raw = torch.log_softmax(logits[len(prompt) - 1 + i], dim=-1)
            _check_position(position, token, raw, tok, K)
        expected = sum(out.logprobs[i][t].logprob for i, t in enumerate(out.token_ids))
        assert out.outputs[0].cumulative_logprob == pytest.approx(expected)


def test_processed_logprobs_include_penalties_temperature_and_top_k(processed_llm, hf_model, prompts):
    """The distribution the token was drawn from, built with transformers' own processors."""
    params = SamplingParams(
        max_tokens=NEW, ignore_eos=True, logprobs=K, repetition_penalty=1.3, temperature=0.7, top_k=8, seed=1
    )
    tok = processed_llm.tokenizer
    processors = [RepetitionPenaltyLogitsProcessor(1.3), TemperatureLogitsWarper(0.7), TopKLogitsWarper(8)]
    for prompt, out in zip(prompts, processed_llm.generate(prompts, params)):
        ids = prompt + list(out.token_ids)
        logits = _hf_logits(hf_model, ids)
        for i, (token, position) in enumerate(zip(out.token_ids, out.logprobs)):
            seen = torch.tensor([ids[: len(prompt) + i]])
            row = logits[len(prompt) - 1 + i][None].clone()
            for proc in processors:
                row = proc(seen, row)
            processed = torch.log_softmax(row[0], dim=-1)
            _check_position(position, token, processed, tok, K)
            assert position[token].rank <= 8  # drawn from inside the top-k


def test_greedy_processed_logprobs_are_penalized_not_tempered(processed_llm, raw_llm, hf_model, prompts):
    params = SamplingParams(max_tokens=NEW, ignore_eos=True, logprobs=0, repetition_penalty=1.3)
    (out,) = processed_llm.generate(prompts[:1], params)
    (raw_out,) = raw_llm.generate(prompts[:1], params)
    assert out.token_ids == raw_out.token_ids  # the mode changes what is reported, never the tokens
    ids = prompts[0] + list(out.token_ids)
    logits = _hf_logits(hf_model, ids)
    differs = 0
    for i, token in enumerate(out.token_ids):
        row = RepetitionPenaltyLogitsProcessor(1.3)(
            torch.tensor([ids[: len(prompts[0]) + i]]), logits[len(prompts[0]) - 1 + i][None].clone()
        )
        expected = torch.log_softmax(row[0], dim=-1)
        assert out.logprobs[i][token].logprob == pytest.approx(float(expected[token]), abs=1e-4)
        assert len(out.logprobs[i]) == 1
        differs += abs(out.logprobs[i][token].logprob - raw_out.logprobs[i][token].logprob) > 1e-3
    assert differs > 0


def test_prompt_logprobs_match_transformers(raw_llm, hf_model, prompts):
    tok = raw_llm.tokenizer
    outs = raw_llm.generate(prompts, SamplingParams(max_tokens=2, ignore_eos=True, prompt_logprobs=3))
    for prompt, out in zip(prompts, outs):
        assert out.logprobs is None and out.prompt_logprobs is not None
        assert len(out.prompt_logprobs) == len(prompt) and out.prompt_logprobs[0] is None
        logits = _hf_logits(hf_model, prompt)
        for q in range(1, len(prompt)):
            _check_position(
                out.prompt_logprobs[q], prompt[q], torch.log_softmax(logits[q - 1], dim=-1), tok, 3
            )


def test_prompt_logprobs_survive_a_shared_cached_prefix(raw_llm, hf_model, prompts):
    """A prompt whose prefix is cached still reports every position (the cache is bypassed for it)."""
    tok = raw_llm.tokenizer
    shared = prompts[1] + prompts[2]
    raw_llm.generate([shared], SamplingParams(max_tokens=1))  # cache its blocks
    (out,) = raw_llm.generate([shared], SamplingParams(max_tokens=1, prompt_logprobs=0))
    logits = _hf_logits(hf_model, shared)
    assert len(out.prompt_logprobs) == len(shared)
    for q in range(1, len(shared)):
        assert len(out.prompt_logprobs[q]) == 1
        _check_position(out.prompt_logprobs[q], shared[q], torch.log_softmax(logits[q - 1], dim=-1), tok, 0)


def test_logprobs_mode_is_validated():
    with pytest.raises(ValueError, match="logprobs_mode"):
        EngineConfig(logprobs_mode="sampled")  # type: ignore[arg-type]
    assert SamplingParams(prompt_logprobs=21).validation_error() is not None
