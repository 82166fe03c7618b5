"""Pipeline parallelism on CUDA (NCCL send/recv, one GPU per rank; eager forward under PP).

Owed: needs a host with two or more GPUs (run by benchmarks/gpu_pp_check.sh); skipped elsewhere.
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.distributed import TensorParallelError
from tests.engine.hf_models import random_prompts
from tests.engine.tp_support import assert_processes_gone

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="pipeline parallelism on CUDA needs 2 GPUs"),
]
PARAMS = SamplingParams(max_tokens=24, ignore_eos=True)


def test_nccl_stages_equal_one_gpu(llama_dir):
    prompts = random_prompts(12, 3, 90, seed=21)
    want = [
        list(o.token_ids)
        for o in LLM(str(llama_dir), dtype="float32", device="cuda").generate(prompts, PARAMS)
    ]
    with LLM(str(llama_dir), dtype="float32", device="cuda", pipeline_parallel_size=2) as two:
        got = [list(o.token_ids) for o in two.generate(prompts, PARAMS)]
        per_rank = two.engine.runner.pipeline_stats()
    assert got == want
    assert (per_rank[:, 2] > 0).all()  # activations went 0 -> 1, logits 1 -> 0


def test_nccl_killed_stage_is_an_error_within_the_bound(llama_dir):
    llm = LLM(
        str(llama_dir), dtype="float32", device="cuda", pipeline_parallel_size=2, distributed_timeout_s=30
    )
    (worker,) = llm.engine.runner.pool.pids
    llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    os.kill(worker, signal.SIGKILL)
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match="was killed by SIGKILL"):
        llm.generate(random_prompts(4, 5, 20, seed=1), PARAMS)
    assert time.monotonic() - start < 30
    llm.close()
    assert_processes_gone([worker])
