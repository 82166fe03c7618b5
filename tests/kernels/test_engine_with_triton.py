"""The engine on the tiny preset gives the same results with the Triton kernels (interpreted on CPU)
as with the torch reference: a wiring check of kernels.select("triton") inside a real model, with
chunked prefill (small token budget) and a prefix-cache hit so steps mix chunks and decodes."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from prefixflow import engine

# find_spec, not importorskip: importing triton at collection would decorate its functions for real,
# before the triton_interpreter fixture can switch the interpreter on for a test.
pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton")

PROMPTS = [[1, 5, 9, 33, 7] * 6, [3, 4] * 10 + [8], [1, 5, 9, 33, 7] * 6 + [11, 12], [42]]


def run(backend: str) -> tuple[list[list[int]], list]:
    llm = engine.LLM(
        model="tiny",
        kernel_backend=backend,
        block_size=16,
        max_num_batched_tokens=24,
        dtype="float32",
        device="cuda" if torch.cuda.is_available() else "cpu",
    )
    params = engine.SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    outs = llm.generate(PROMPTS, params)
    assert all(o.finish_reason == "length" for o in outs), [o.error for o in outs]
    scores = llm.score_choices([[1, 5, 9], [3, 4, 3]], [["a b", "c"], ["d"]])
    return [list(o.token_ids) for o in outs], scores


def test_engine_tokens_and_scores_match_reference_backend() -> None:
    ref_tokens, ref_scores = run("torch")
    tri_tokens, tri_scores = run("triton")
    assert tri_tokens == ref_tokens
    for ref, tri in zip(ref_scores, tri_scores):
        assert not isinstance(tri, str), tri
        assert tri == pytest.approx(ref, rel=1e-6, abs=0)  # float32 noise ~1e-7; a 1 % scale error ~5e-6
