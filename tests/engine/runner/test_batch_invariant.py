"""``EngineConfig.batch_invariant``: a request's tokens and log-probs are the same bits whatever else the
engine runs beside it — alone, in a batch of other prompts, after a prefix-cache hit, cut into
chunked-prefill pieces, or after preemption — and still transformers' distribution."""

from __future__ import annotations

import pytest
import torch

from prefixflow.engine import LLM, EngineConfig, SamplingParams
from tests.engine.hf_models import random_prompts

NEW = 6


def _engine(llama_dir, **overrides) -> LLM:
    options = dict(dtype="float32", device="cpu", block_size=8, max_num_seqs=16, batch_invariant=True)
    options.update(overrides)
    return LLM(str(llama_dir), **options)


def _params() -> SamplingParams:
    return SamplingParams(max_tokens=NEW, ignore_eos=True, logprobs=3)


def _bits(out) -> list[tuple[int, list[tuple[int, float]]]]:
    """Every generated token with its exact log-probs (top entries included)."""
    return [
        (token, sorted((t, lp.logprob) for t, lp in position.items()))
        for token, position in zip(out.token_ids, out.outputs[0].logprobs)
    ]


@pytest.fixture(scope="module")
def target():
    (prompt,) = random_prompts(1, 37, 37, seed=11)
    return prompt


@pytest.fixture(scope="module")
def alone(llama_dir, target):
    (out,) = _engine(llama_dir).generate([target], _params())
    return _bits(out)


def test_a_row_beside_other_rows_gets_the_same_bits(llama_dir, target, alone):
    others = random_prompts(9, 3, 60, seed=12)
    outs = _engine(llama_dir).generate(others[:4] + [target] + others[4:], _params())
    assert _bits(outs[4]) == alone


def test_a_prefix_cache_hit_gets_the_same_bits(llama_dir, target, alone):
    llm = _engine(llama_dir)
    llm.generate([target[:29] + [7, 8, 9]], _params())  # warms the first 3 blocks of the target
    (out,) = llm.generate([target], _params())
    assert out.num_cached_tokens >= 24
    assert _bits(out) == alone


def test_chunked_prefill_gets_the_same_bits(llama_dir, target, alone):
    others = random_prompts(5, 20, 40, seed=13)
    llm = _engine(llama_dir, max_num_batched_tokens=16)
    outs = llm.generate(others + [target], _params())
    assert llm.stats().steps > 2 * len(target) // 16  # the prompts were cut into 16-token pieces
    assert _bits(outs[-1]) == alone


def test_preemption_gets_the_same_bits(llama_dir, target):
    # 30 blocks of 4 tokens hold one request alone but not the batch: outputs outgrow the admission
    # reservation, so running requests get preempted and recomputed (as in test_hf_equivalence)
    params = SamplingParams(max_tokens=40, ignore_eos=True, logprobs=3)
    (single,) = _engine(llama_dir, block_size=4).generate([target], params)
    crowded = _engine(llama_dir, block_size=4, num_kv_blocks=30)
    outs = crowded.generate(random_prompts(4, 20, 40, seed=14) + [target], params)
    assert crowded.stats().preemptions > 0
    assert _bits(outs[-1]) == _bits(single)


def test_invariant_results_are_still_transformers_distribution(llama_dir, target, alone):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32).eval()
    ids = target + [token for token, _ in alone]
    with torch.inference_mode():
        logits = hf(torch.tensor([ids])).logits[0].float()
    for i, (token, top) in enumerate(alone):
        row = torch.log_softmax(logits[len(target) - 1 + i], dim=-1)
        assert token == int(row.argmax())
        for t, logprob in top:
            assert logprob == pytest.approx(float(row[t]), abs=1e-4)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(device="cuda"), "CPU torch kernels"),
        (dict(kernel_backend="triton"), "CPU torch kernels"),
        (dict(batch_invariant="yes"), "true or false"),
    ],
)
def test_bad_batch_invariant_settings_are_refused(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(batch_invariant=options.pop("batch_invariant", True), **options)
