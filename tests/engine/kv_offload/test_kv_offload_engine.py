"""The host KV tier inside the engine: the same tokens with it on and off (greedy and seeded, every
tiny architecture, tensor and pipeline parallelism, the embedded model), on a pool small enough that prefix blocks
are evicted and running requests preempted, and the stats show the tier really worked."""

from __future__ import annotations

import pytest

from prefixflow.engine import LLM, SamplingParams
from tests.engine.hf_models import hf_greedy, random_prompts
from tests.engine.tp_support import assert_processes_gone

# 24 blocks of 4 tokens, 16 tokens per step: prompts sharing a 12-token prefix hit the cache, the
# 40-token prompt is chunked, prefix groups evict each other, and 24 output tokens outgrow the
# admission reservation (prompt + 4 blocks), so running requests are preempted.
OPTIONS = dict(
    dtype="float32", device="cpu", num_kv_blocks=24, block_size=4, max_num_batched_tokens=16, ordering="fifo"
)
HOST = 1 << 20
GREEDY = SamplingParams(max_tokens=24, ignore_eos=True)


def prompts() -> list[list[int]]:
    first, second = random_prompts(2, 12, 12, seed=3)
    tails = random_prompts(8, 3, 10, seed=4)
    rows = (
        [first + t for t in tails[:4]] + [second + t for t in tails[4:]] + random_prompts(1, 40, 40, seed=6)
    )
    return rows + [first + t for t in tails[:4]]  # the first group again, after the second evicted it


def seeded(n: int) -> list[SamplingParams]:
    return [SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=100 + i) for i in range(n)]


def run(llm: LLM, rows: list[list[int]], params: SamplingParams | list[SamplingParams]) -> list[list[int]]:
    return [list(o.token_ids) for o in llm.generate(rows, params)]


def assert_tier_worked(llm: LLM) -> None:
    stats = llm.stats()
    assert stats.kv_host_blocks > 0
    assert stats.kv_offloaded_tokens > 0, "evicted blocks must be offloaded"
    assert stats.kv_reloaded_tokens > 0, "a later hit must reload instead of recomputing"
    assert 0 < stats.host_hit_rate <= 1
    assert stats.preemptions > 0, "the workload must preempt"


@pytest.fixture(scope="module")
def rows():
    return prompts()


def test_greedy_and_seeded_tokens_identical_with_the_host_tier(llama_dir, rows):
    off = LLM(str(llama_dir), **OPTIONS)
    on = LLM(str(llama_dir), kv_offload_bytes=HOST, **OPTIONS)
    want = run(off, rows, GREEDY)
    assert want == hf_greedy(llama_dir, rows, GREEDY.max_tokens)
    assert run(on, rows, GREEDY) == want
    assert_tier_worked(on)
    assert on.stats().computed_prompt_tokens < off.stats().computed_prompt_tokens
    assert off.stats().kv_offloaded_tokens == 0 and off.stats().kv_host_blocks == 0
    assert run(on, rows, seeded(len(rows))) == run(off, rows, seeded(len(rows)))


def test_preempted_requests_reload_instead_of_recomputing(llama_dir):
    # four requests that each grow to 16 blocks in a 20-block pool: every preemption's blocks are
    # evicted by the others' growth before it resumes, so without the tier it recomputes them
    rows = random_prompts(4, 20, 24, seed=11)
    opts = dict(OPTIONS, num_kv_blocks=20)
    params = SamplingParams(max_tokens=40, ignore_eos=True)
    off = LLM(str(llama_dir), **opts)
    on = LLM(str(llama_dir), kv_offload_bytes=HOST, **opts)
    assert run(on, rows, params) == run(off, rows, params)
    assert off.stats().preemptions > 0 and on.stats().preemptions > 0
    assert on.stats().kv_reloaded_tokens > 0
    assert on.stats().kv_recomputed_tokens < off.stats().kv_recomputed_tokens / 2


def test_every_tiny_architecture_is_unchanged_by_the_host_tier(arch_dir, rows):
    small = rows[:6] + rows[-3:]
    want = run(LLM(str(arch_dir), **OPTIONS), small, GREEDY)
    on = LLM(str(arch_dir), kv_offload_bytes=HOST, **OPTIONS)
    assert run(on, small, GREEDY) == want
    assert on.stats().kv_offloaded_tokens > 0


def test_host_tier_under_tensor_parallelism_equals_one_rank(llama_dir, rows):
    want = run(LLM(str(llama_dir), **OPTIONS), rows, GREEDY)
    with LLM(str(llama_dir), tensor_parallel_size=2, kv_offload_bytes=HOST, **OPTIONS) as two:
        pids = two.engine.runner.pool.pids
        got = run(two, rows, GREEDY)
        assert_tier_worked(two)
    assert got == want
    assert_processes_gone(pids)


@pytest.mark.slow
def test_host_tier_under_pipeline_parallelism_equals_one_rank(llama_dir, rows):
    # issue 29 x 28: each stage offloads and reloads its own layers' KV under the one plan rank 0 makes
    want = run(LLM(str(llama_dir), **OPTIONS), rows, GREEDY)
    with LLM(str(llama_dir), pipeline_parallel_size=2, kv_offload_bytes=HOST, **OPTIONS) as two:
        pids = two.engine.runner.pool.pids
        got = run(two, rows, GREEDY)
        assert_tier_worked(two)
        per_rank = two.engine.runner.pipeline_stats()
    assert got == want
    assert per_rank[:, 3].tolist() == [two.stats().steps] * 2  # both stages ran every step
    assert_processes_gone(pids)


def test_a_host_tier_too_small_for_one_block_is_off(llama_dir):
    llm = LLM(str(llama_dir), kv_offload_bytes=1, **OPTIONS)
    assert llm.engine.kv.host is None and llm.stats().kv_host_blocks == 0


def test_kv_offload_bytes_must_be_a_non_negative_int():
    with pytest.raises(ValueError, match="kv_offload_bytes"):
        LLM("tiny", kv_offload_bytes=-1)
    with pytest.raises(ValueError, match="kv_offload_bytes"):
        LLM("tiny", kv_offload_bytes=1.5)


@pytest.mark.slow
def test_embedded_model_is_unchanged_by_the_host_tier():
    opts = dict(OPTIONS, block_size=16, num_kv_blocks=8, max_num_batched_tokens=64)
    chat = [[1, 9690, 198] + p for p in random_prompts(4, 20, 36, vocab=20000, seed=8)]
    rows_ = chat + chat[:2]  # the first two again, after the others evicted them
    params = SamplingParams(max_tokens=16, ignore_eos=True)
    want = run(LLM("smollm2-135m-instruct", **opts), rows_, params)
    on = LLM("smollm2-135m-instruct", kv_offload_bytes=64 << 20, **opts)
    assert run(on, rows_, params) == want
    assert on.stats().kv_offloaded_tokens > 0 and on.stats().kv_reloaded_tokens > 0
