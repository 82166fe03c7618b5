"""What vLLM users type first: `outputs[0].outputs[0].text`, `SamplingParams(n=4)`, the three penalties,
`llm.chat(...)`, and `generate` over a generator. Penalties are checked against transformers' logits."""

from __future__ import annotations

import pytest
import torch

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import random_prompts

NEW = 12


@pytest.fixture(scope="module")
def llm(llama_dir):
    return LLM(str(llama_dir), dtype="float32", device="cpu", max_num_seqs=8, block_size=8)


@pytest.fixture(scope="module")
def hf_model(llama_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(llama_dir), dtype=torch.float32).eval()


def test_request_output_has_vllms_outputs_list(llm) -> None:
    (out,) = llm.generate(["hello there"], SamplingParams(max_tokens=5, logprobs=0, ignore_eos=True))
    (sample,) = out.outputs
    assert out.finished and sample.index == 0 and out.prompt == "hello there"
    assert sample.text == out.text and sample.token_ids == out.token_ids and sample.finish_reason == "length"
    assert sample.cumulative_logprob == pytest.approx(
        sum(p[t].logprob for p, t in zip(out.logprobs, out.token_ids))
    )


@torch.inference_mode()
def _hf_penalized_greedy(
    model, prompt: list[int], presence: float, frequency: float, repetition: float
) -> list[int]:
    """Greedy decoding on transformers' logits with the penalties written out as vLLM/OpenAI define them."""
    ids = list(prompt)
    for _ in range(NEW):
        logits = model(torch.tensor([ids])).logits[0, -1].float()
        for t in set(ids):  # repetition: every token of the prompt and the output so far
            logits[t] = logits[t] / repetition if logits[t] > 0 else logits[t] * repetition
        out = ids[len(prompt) :]
        for t in set(out):  # presence and frequency: output tokens only
            logits[t] -= presence + frequency * out.count(t)
        ids.append(int(logits.argmax()))
    return ids[len(prompt) :]


@pytest.mark.parametrize(
    "presence,frequency,repetition", [(0.0, 0.0, 1.6), (1.5, 0.0, 1.0), (0.0, 0.9, 1.0), (0.5, 0.5, 1.3)]
)
def test_penalties_match_a_reference_on_transformers_logits(
    llm, hf_model, presence, frequency, repetition
) -> None:
    prompts = random_prompts(3, 4, 20, seed=3)
    params = SamplingParams(
        max_tokens=NEW,
        ignore_eos=True,
        presence_penalty=presence,
        frequency_penalty=frequency,
        repetition_penalty=repetition,
    )
    got = [list(o.token_ids) for o in llm.generate(prompts, params)]
    plain = [
        list(o.token_ids) for o in llm.generate(prompts, SamplingParams(max_tokens=NEW, ignore_eos=True))
    ]
    assert got == [_hf_penalized_greedy(hf_model, p, presence, frequency, repetition) for p in prompts]
    assert got != plain  # the penalties did change something on this random model


def test_bad_penalties_and_n_are_error_outputs(llm) -> None:
    outs = llm.generate(
        ["a", "b", "c"],
        [SamplingParams(presence_penalty=3.0), SamplingParams(repetition_penalty=0), SamplingParams(n=0)],
    )
    assert [o.finish_reason for o in outs] == ["error"] * 3
    assert (
        "presence_penalty" in outs[0].error
        and "repetition_penalty" in outs[1].error
        and "n must" in outs[2].error
    )


def test_n_samples_share_the_prompts_kv_blocks(llm) -> None:
    prompt = random_prompts(1, 45, 45, seed=11)[0]  # 5 full blocks of 8 plus 5 tokens
    params = SamplingParams(n=4, temperature=1.0, seed=123, max_tokens=NEW, ignore_eos=True)
    before = llm.stats().computed_prompt_tokens
    (out,) = llm.generate([prompt], params)
    computed = llm.stats().computed_prompt_tokens - before
    assert len(out.outputs) == 4 and [s.index for s in out.outputs] == [0, 1, 2, 3]
    # one prefill; the other samples map its 5 full blocks and share the partial block's 4 tokens
    # (token-granular sharing, copy-on-write), computing only the last prompt token, which is always computed
    assert computed == 45 + 3 * 1
    assert out.metadata["cached_tokens_per_sample"][1:] == [44, 44, 44]
    assert out.num_prompt_tokens == 45 and out.num_output_tokens == 4 * NEW
    texts = {s.token_ids for s in out.outputs}
    assert len(texts) > 1  # each sample draws from its own seed stream
    (single,) = llm.generate(
        [prompt], SamplingParams(temperature=1.0, seed=123, max_tokens=NEW, ignore_eos=True)
    )
    assert out.outputs[0].token_ids == single.token_ids  # sample 0 is the n=1 request
    others = random_prompts(5, 5, 30, seed=12)
    mixed = llm.generate(
        [*others[:2], prompt, *others[2:]],
        [SamplingParams(max_tokens=3)] * 2 + [params] + [SamplingParams(max_tokens=3)] * 3,
    )
    assert [s.token_ids for s in mixed[2].outputs] == [s.token_ids for s in out.outputs]  # batch-invariant


def test_greedy_n_gives_n_equal_samples(llm) -> None:
    (out,) = llm.generate(["same"], SamplingParams(n=3, max_tokens=6, ignore_eos=True))
    (one,) = llm.generate(["same"], SamplingParams(max_tokens=6, ignore_eos=True))
    assert [s.token_ids for s in out.outputs] == [one.token_ids] * 3


def test_chat_takes_one_conversation_or_a_list(llm) -> None:
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Name a river."}]
    other = [{"role": "user", "content": "And a mountain?"}]
    params = SamplingParams(max_tokens=5, ignore_eos=True)
    (one,) = llm.chat(convo, params)
    both = llm.chat([convo, other], params)
    assert len(both) == 2 and both[0].token_ids == one.token_ids
    text = llm.apply_chat_template(other)
    ids = llm.tokenizer.encode(text, add_special_tokens=False)
    assert both[1].token_ids == llm.generate([ids], params)[0].token_ids and both[1].prompt == text


def test_generate_over_a_generator_is_lazy_and_bounded(llm) -> None:
    prompts = random_prompts(60, 3, 12, seed=5)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    expected = [o.token_ids for o in llm.generate(prompts, params)]
    llm.stream_window = 10
    pulled, in_engine = [], []

    def source():
        for p in prompts:
            pulled.append(1)
            in_engine.append(llm.engine.num_unfinished())
            yield p

    stream = llm.generate_stream(source(), params)
    first = next(stream)
    assert len(pulled) < len(prompts)  # the first result came before the input was read to the end
    outs = [first, *stream]
    assert sorted(o.index for o in outs) == list(range(60))
    assert [o.token_ids for o in sorted(outs, key=lambda o: o.index)] == expected
    assert max(in_engine) < llm.config.max_num_seqs + llm.stream_window  # bounded: never the whole input
