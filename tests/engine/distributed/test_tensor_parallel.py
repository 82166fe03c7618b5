"""Tensor parallelism on CPU (gloo, 2 ranks, float32): the same tokens as one rank, for every way a
model splits, on a workload where prefix caching, chunked prefill and preemption all happen.

The default run keeps one architecture (GQA, the common case); the others are marked slow because
every TP engine starts a worker process (several seconds on a loaded 2-core machine).
"""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import hf_greedy, random_prompts
from tests.engine.tp_support import assert_processes_gone

# Tiny pool and budget: 30 blocks of 4 tokens, 16 tokens per step. The 60-token prompt is computed in
# chunks, prompts sharing a 12-token prefix hit the prefix cache, and 32 output tokens outgrow the
# admission reservation (prompt + 4 blocks), so running requests get preempted and recomputed.
OPTIONS = dict(dtype="float32", device="cpu", num_kv_blocks=30, block_size=4, max_num_batched_tokens=16)
GREEDY = SamplingParams(max_tokens=32, ignore_eos=True)


def _prompts() -> list[list[int]]:
    prefix = random_prompts(1, 12, 12, seed=3)[0]
    tails = random_prompts(4, 3, 10, seed=4)
    return [prefix + t for t in tails] + random_prompts(2, 5, 20, seed=5) + random_prompts(1, 60, 60, seed=6)


def _seeded(n: int) -> list[SamplingParams]:
    return [
        SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, top_k=50, seed=100 + i) for i in range(n)
    ]


def _run(llm: LLM, prompts: list[list[int]]) -> tuple[list[list[int]], list[list[int]]]:
    greedy = [list(o.token_ids) for o in llm.generate(prompts, GREEDY)]
    sampled = [list(o.token_ids) for o in llm.generate(prompts, _seeded(len(prompts)))]
    return greedy, sampled


def _check_parity(model_dir, against_transformers: bool = True) -> None:
    prompts = _prompts()
    one = LLM(str(model_dir), **OPTIONS)
    want_greedy, want_sampled = _run(one, prompts)
    with LLM(str(model_dir), tensor_parallel_size=2, **OPTIONS) as two:
        pids = two.engine.runner.pool.pids
        got_greedy, got_sampled = _run(two, prompts)
        stats = two.stats()
        collectives = two.engine.runner.collective_stats()
        layers = two.engine.model_cfg.num_layers
    assert got_greedy == want_greedy
    assert got_sampled == want_sampled
    if against_transformers:
        assert got_greedy == hf_greedy(model_dir, prompts, GREEDY.max_tokens)
    assert stats.preemptions > 0, "the workload must preempt"
    assert stats.cached_prompt_tokens > 0, "the workload must hit the prefix cache"
    assert max(len(p) for p in prompts) > OPTIONS["max_num_batched_tokens"], "a prompt must be chunked"
    # one all-reduce after o_proj and one after down_proj per layer, one for the embedding; every rank
    assert collectives[:, 1].tolist() == [(2 * layers + 1) * stats.steps] * 2
    assert_processes_gone(pids)


def test_gqa_two_ranks_equal_one(llama_dir):
    _check_parity(llama_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mistral-mqa", "qwen2-bias-tied", "qwen3-qknorm-headdim"])
def test_every_split_equals_one_rank(model_root, name):
    from tests.engine.hf_models import make_model_dir

    _check_parity(make_model_dir(model_root, name))


@pytest.mark.slow
def test_gptq_act_order_checkpoint_two_ranks_equal_one(quant_root):
    """Row-parallel down_proj / o_proj over an act-order checkpoint: each rank keeps every group's
    scales and its slice of g_idx (tests/engine/quantization/test_quantized_tensor_parallel.py covers the formats
    on a light workload; this is the same pressure workload as the dense splits)."""
    from tests.engine.quant_models import make_base
    from tests.engine.quant_packers import Fmt, write_quantized

    quant_dir, _, _ = write_quantized(
        make_base(quant_root, "llama"), quant_root, Fmt("gptq", 4, 32, sym=False, act_order=True)
    )
    _check_parity(quant_dir, against_transformers=False)  # transformers needs optimum to read GPTQ
