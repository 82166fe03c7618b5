"""The embedded SmolLM2-135M-Instruct GGUF through the engine matches transformers' own GGUF loading.

Reference: ``AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`` in float32, greedy ``generate``
one prompt at a time (no padding, so nothing but the model decides its tokens). The engine gets all
prompts at once, so they share continuous batches with chunked prefills of different lengths.

Slow (about 130 s on a shared 2-core machine: two loads of the model, one of them transformers'
dequantizing GGUF loader, and 12 reference generations), so it runs in the slow set (CI runs that
too). The default run keeps the GGUF path covered by test_gguf_loader.py (engine against transformers
on small GGUF files) and the embedded model by test_smollm2_quality.py.
"""

from __future__ import annotations

import pytest
import torch

from prefixflow.engine.loading.embedded import resolve_embedded

pytestmark = pytest.mark.slow

MAX_TOKENS = 24
QUESTIONS = [
    "Hi!",
    "What is the capital of France?",
    "Name three primary colors.",
    "Write a haiku about autumn rain.",
    "Explain in one sentence why the sky is blue.",
    "Translate 'good morning' into Spanish.",
    "List four fruits that are yellow when ripe, and say which one you like best.",
    "Is this review positive or negative? 'The blender broke after two days and support never answered.'",
    "Summarize in one sentence: The city council voted on Tuesday to extend the hours of the public "
    "library on weekends, citing a rise in student visitors during exam season. The change starts next "
    "month and will be paid for by a small cut to the events budget.",
    "Give me a short tip for sleeping better.",
    "A train leaves at 3 pm and the trip takes 2 hours and 45 minutes. When does it arrive? Answer briefly.",
    "Write a friendly two-sentence note to a neighbour asking them to water my plants while I travel "
    "for a week in July, and thank them in advance for their help with the garden and the tomatoes.",
]


@pytest.fixture(scope="module")
def gguf_path():
    return resolve_embedded("smollm2-135m-instruct")


@pytest.fixture
def one_thread():
    """One intra-op thread: on a 2-core machine shared with other jobs, spinning thread pools cost up
    to 6x in wall time; results do not depend on it (both sides run in the same setting)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_engine_greedy_tokens_equal_transformers_gguf(gguf_path, one_thread):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefixflow.engine import LLM, SamplingParams

    llm = LLM(model="smollm2-135m-instruct", dtype="float32")
    prompts = [llm.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    outputs = llm.generate(prompts, SamplingParams(max_tokens=MAX_TOKENS))

    try:
        import accelerate  # noqa: F401  (transformers refuses to load GGUF without it)
    except ImportError:
        pytest.fail("the reference needs accelerate: pip install accelerate")
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    ref = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    ref.eval()

    lengths = set()
    for q, prompt, out in zip(QUESTIONS, prompts, outputs):
        messages = [{"role": "user", "content": q}]
        assert prompt == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tok(prompt, add_special_tokens=False, return_tensors="pt").input_ids
        assert list(out.prompt_token_ids) == ids[0].tolist(), q
        lengths.add(ids.shape[1])
        with torch.no_grad():
            gen = ref.generate(
                ids, attention_mask=torch.ones_like(ids), max_new_tokens=MAX_TOKENS, do_sample=False
            )
        want = gen[0, ids.shape[1] :].tolist()
        assert out.finish_reason == ("stop" if len(want) < MAX_TOKENS else "length"), q
        got = list(out.token_ids)
        if want and want[-1] in llm_eos(tok) and got == want[:-1]:
            want = want[:-1]  # the engine may leave the stop token out of token_ids
        assert got == want, f"{q!r}: engine {tok.decode(got)!r} != transformers {tok.decode(want)!r}"
    assert max(lengths) - min(lengths) > 40  # mixed prompt lengths really were batched together


def llm_eos(tok) -> set[int]:
    return {tok.eos_token_id}
