"""The host KV tier on CUDA (owed: run by benchmarks/gpu_check.sh): pinned host memory, side-stream
copies with events, the same tokens with the tier on and off, and the tier really used; the disk tier's
pinned staging."""

from __future__ import annotations

import pytest
import torch

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import random_prompts

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def test_side_stream_host_tier_gives_the_same_tokens_on_cuda(llama_dir):
    first, second = random_prompts(2, 12, 12, seed=3)
    tails = random_prompts(8, 3, 10, seed=4)
    rows = [first + t for t in tails[:4]] + [second + t for t in tails[4:]] + [first + t for t in tails[:4]]
    opts = dict(
        device="cuda",
        dtype="float32",
        num_kv_blocks=24,
        block_size=4,
        max_num_batched_tokens=16,
        ordering="fifo",
    )
    params = SamplingParams(max_tokens=24, ignore_eos=True)
    want = [o.token_ids for o in LLM(str(llama_dir), **opts).generate(rows, params)]
    on = LLM(str(llama_dir), kv_offload_bytes=1 << 20, **opts)
    assert [o.token_ids for o in on.generate(rows, params)] == want
    store = on.engine.runner.shard.host_kv
    assert store.host.is_pinned() and store.stream is not None
    stats = on.stats()
    assert stats.kv_offloaded_tokens > 0 and stats.kv_reloaded_tokens > 0


def test_disk_tier_round_trip_through_pinned_staging_on_cuda(llama_dir, tmp_path, monkeypatch):
    # kv_cache_dir on CUDA: persists are staged into pinned memory on the side stream and written once
    # its event fired; a second engine reads them into the pinned host store and reloads them
    from prefixflow.engine.kv_offload import cost_model

    monkeypatch.setattr(cost_model, "DISK_RATE", (1e15, 0.0))  # tiny blocks: make the read pay
    head = random_prompts(1, 40, 40, seed=3)[0]
    rows = [head + t for t in random_prompts(5, 3, 9, seed=4)]
    opts = dict(device="cuda", dtype="float32", num_kv_blocks=48, block_size=4, max_num_batched_tokens=32)
    params = SamplingParams(max_tokens=6, ignore_eos=True)
    want = [o.token_ids for o in LLM(str(llama_dir), **opts).generate(rows, params)]
    for turn in range(2):
        with LLM(str(llama_dir), kv_cache_dir=str(tmp_path), **opts) as llm:
            assert [o.token_ids for o in llm.generate(rows, params)] == want
            stats = llm.stats()
        assert (stats.kv_disk_hits > 0) == (turn == 1) and stats.kv_disk_failed_blocks == 0
