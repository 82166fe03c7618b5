"""On a CUDA machine: the engine with Triton kernels and CUDA graphs gives the tokens of the torch
reference path, and of transformers. Skipped (with the reason) without CUDA."""

from __future__ import annotations

import pytest
import torch

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import hf_greedy, random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
PARAMS = SamplingParams(max_tokens=12, ignore_eos=True)


def test_triton_and_cuda_graphs_match_reference_and_transformers(llama_dir):
    prompts = random_prompts(12, 3, 90, seed=21)
    fast = LLM(str(llama_dir), dtype="float32", device="cuda", max_num_seqs=16)
    assert fast.engine.runner.shard.ops.name == "triton"
    assert fast.engine.runner.shard.graphs is not None and fast.engine.runner.shard.graphs.graphs, (
        "no CUDA graph captured"
    )
    got = [list(o.token_ids) for o in fast.generate(prompts, PARAMS)]
    eager = LLM(str(llama_dir), dtype="float32", device="cuda", kernel_backend="torch", enforce_eager=True)
    assert got == [list(o.token_ids) for o in eager.generate(prompts, PARAMS)]
    assert got == hf_greedy(llama_dir, prompts, PARAMS.max_tokens)


def test_kv_pool_is_sized_from_free_memory(llama_dir):
    llm = LLM(str(llama_dir), device="cuda", gpu_memory_utilization=0.5)
    runner = llm.engine.runner
    pool_bytes = runner.num_blocks * runner.shard.block_bytes
    total = torch.cuda.get_device_properties(0).total_memory
    assert 0.2 * total < pool_bytes < 0.5 * total
    outs = llm.generate(random_prompts(64, 10, 200, seed=3), SamplingParams(max_tokens=32, ignore_eos=True))
    assert all(o.finish_reason == "length" for o in outs)
