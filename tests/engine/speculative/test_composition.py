"""Speculation composes: structured outputs (the grammar mask at every proposed position, the matcher
advancing over accepted tokens only), stop strings inside an accepted run, and tensor parallelism
(rank 0 proposes, both gloo ranks verify)."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams, StructuredOutputs
from tests.engine.speculative.helpers import prompts, run
from tests.engine.tp_support import assert_processes_gone

ENGINE = dict(dtype="float32", device="cpu", block_size=4, num_kv_blocks=2048)  # a small pool: fast to build
NGRAM = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SCHEMA = {
    "type": "object",
    "properties": {
        "tags": {"type": "array", "items": {"type": "string", "enum": ["ab", "abab", "ba"]}, "maxItems": 6},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
    },
    "required": ["tags", "stars"],
}


@pytest.mark.parametrize(
    "structured",
    [StructuredOutputs(regex=r"(ab|ba|abc)+"), StructuredOutputs(json_schema=SCHEMA)],
    ids=["regex", "json"],
)
def test_structured_outputs_identical_with_drafts_checked_by_the_grammar(structured):
    items = prompts(7, seed=12)
    params = SamplingParams(temperature=0.0, max_tokens=40, structured=structured)
    off, _, _ = run("tiny", items, params, None, **ENGINE)
    on, stats, llm = run("tiny", items, params, NGRAM, **ENGINE)
    assert on == off
    kinds = stats.speculation.values()  # the lookup's drafts and the grammar-forced ones (jump_forward)
    assert 0 < sum(k["accepted"] for k in kinds) < sum(k["proposed"] for k in kinds)


def test_stop_strings_inside_an_accepted_run():
    llm_off = LLM("tiny", **ENGINE)
    items = prompts(7, seed=13)
    probe = llm_off.generate(items, SamplingParams(temperature=0.0, max_tokens=30, ignore_eos=True))
    # a stop string from the middle of each output: it is found inside a verified run, not only at its end
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, stop=[o.text[len(o.text) // 2 :][:3] or "zz"])
        for o in probe
    ]
    a = llm_off.generate(items, params)
    llm = LLM("tiny", speculative_config=NGRAM, **ENGINE)
    b = llm.generate(items, params)
    assert [(o.token_ids, o.text, o.stop_reason) for o in a] == [
        (o.token_ids, o.text, o.stop_reason) for o in b
    ]
    assert any(o.finish_reason == "stop" and isinstance(o.stop_reason, str) for o in b)
    assert llm.stats().speculation["ngram"]["accepted"] > 0


@pytest.mark.slow
def test_tensor_parallel_two_ranks_identical():
    items = prompts(7, seed=14)
    greedy = SamplingParams(temperature=0.0, max_tokens=32, ignore_eos=True)
    seeded = [
        SamplingParams(temperature=0.5, top_k=2, seed=i, max_tokens=24, ignore_eos=True) for i in range(7)
    ]
    off_greedy, _, _ = run("tiny", items, greedy, None, **ENGINE)
    off_seeded, _, _ = run("tiny", items, seeded, None, **ENGINE)
    with LLM("tiny", tensor_parallel_size=2, speculative_config=NGRAM, **ENGINE) as llm:
        assert llm.engine.runner.pool is not None
        pids = llm.engine.runner.pool.pids
        assert [o.token_ids for o in llm.generate(items, greedy)] == off_greedy
        assert [o.token_ids for o in llm.generate(items, seeded)] == off_seeded
        assert llm.stats().speculation["ngram"]["accepted"] > 0
    assert_processes_gone(pids)
