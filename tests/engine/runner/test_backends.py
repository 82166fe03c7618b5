"""The engine gives the same tokens with the Triton kernels (interpreted on CPU) and through the
padded decode-graph buffers as with the torch reference path."""

from __future__ import annotations

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.runner.decode_graphs import bucket_sizes
from tests.engine.hf_models import hf_greedy, random_prompts

PARAMS = SamplingParams(max_tokens=4, ignore_eos=True)


def test_triton_backend_matches_torch_backend(llama_dir, triton_interpreter):
    prompts = random_prompts(3, 5, 40, seed=3)
    options = dict(dtype="float32", device="cpu", max_num_batched_tokens=32, block_size=16)
    ref = LLM(str(llama_dir), kernel_backend="torch", **options).generate(prompts, PARAMS)
    tri_llm = LLM(str(llama_dir), kernel_backend="triton", **options)
    assert tri_llm.engine.runner.shard.ops.name == "triton"
    tri = tri_llm.generate(prompts, PARAMS)
    assert [o.token_ids for o in tri] == [o.token_ids for o in ref]


def test_padded_decode_buffers_match_transformers(llama_dir):
    prompts = random_prompts(5, 3, 30, seed=5)
    llm = LLM(str(llama_dir), dtype="float32", device="cpu", max_num_seqs=8)
    runner = llm.engine.runner
    runner.shard.graphs = runner.shard.make_decode_graphs(
        64, capture=False
    )  # the CUDA path's buffers, run eagerly
    outs = llm.generate(prompts, SamplingParams(max_tokens=6, ignore_eos=True))
    assert [list(o.token_ids) for o in outs] == hf_greedy(llama_dir, prompts, 6)


def test_bucket_sizes_cover_every_batch():
    sizes = bucket_sizes(40)
    assert sizes[0] == 1 and sizes[-1] == 40
    assert all(any(s >= b for s in sizes) for b in range(1, 41))
