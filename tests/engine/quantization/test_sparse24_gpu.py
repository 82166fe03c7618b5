"""On CUDA SM >= 8.0: 2:4 layers run ``to_sparse_semi_structured`` and agree with the dense path.
Skipped (with the reason) elsewhere; run by benchmarks/gpu_check.sh."""

from __future__ import annotations

import pytest
import torch

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import random_prompts
from tests.engine.quant_models import make_base
from tests.engine.sparse_packers import SparseFmt, write_sparse

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 0),
        reason="needs CUDA SM >= 8.0",
    ),
]


def test_semi_structured_layer_equals_dense():
    from torch.sparse import to_sparse_semi_structured

    from prefixflow.engine.quantization.sparse24 import prune_24

    w = prune_24(torch.randn(512, 1024, device="cuda", dtype=torch.bfloat16))
    x = torch.randn(37, 1024, device="cuda", dtype=torch.bfloat16)  # a row count no kernel tile divides
    want = torch.nn.functional.linear(x, w).float()
    got = torch.nn.functional.linear(x, to_sparse_semi_structured(w)).float()
    assert (got - want).abs().max() <= 2e-2 * want.abs().max()


def test_sparse_checkpoint_runs_the_semi_structured_kernel_and_the_dense_twins_tokens(quant_root):
    sparse_dir, twin_dir = write_sparse(
        make_base(quant_root, "llama"), quant_root, SparseFmt("sparse-24-bitmask")
    )
    prompts = random_prompts(8, 3, 60, seed=4)
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    llm = LLM(str(sparse_dir), dtype="bfloat16", device="cuda")
    assert llm.engine.model_identity["quantization"]["sparsity"]["kernel"] == "semi-structured"
    from prefixflow.engine.quantization.report import linear_kernels

    assert any(k.endswith("/semi-structured") for k in linear_kernels(llm.engine.runner.shard.model))
    got = [list(o.token_ids) for o in llm.generate(prompts, params)]
    want = [
        list(o.token_ids)
        for o in LLM(str(twin_dir), dtype="bfloat16", device="cuda").generate(prompts, params)
    ]
    same = sum(a == b for g, w in zip(got, want) for a, b in zip(g, w))
    assert same >= 0.9 * sum(map(len, want))  # bf16 sums in another order may flip a rare near-tie
