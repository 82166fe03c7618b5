"""Pipeline parallelism on CPU (gloo, float32): PP=2 and PP=2 x TP=2 give transformers' greedy tokens and
PP=1's seeded samples on the architecture corners, on the workload of the TP tests (prefix hits, chunked
prefill and preemption all happen); the split; a killed or hung stage is a clear error, no orphans.

The default run keeps PP=2 on GQA and the killed stage; the rest is slow (each engine starts 1-3
worker processes on a loaded 2-core machine).
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.distributed import ShardingError, TensorParallelError
from prefixflow.engine.distributed.pipeline import stage_layers
from prefixflow.engine.distributed.pipeline_step import micro_batches
from tests.engine.distributed.test_tensor_parallel import GREEDY, OPTIONS, _prompts, _run
from tests.engine.hf_models import hf_greedy, make_model_dir, random_prompts
from tests.engine.tp_support import assert_processes_gone


@functools.cache
def _reference(model_dir: str, against_transformers: bool) -> tuple:
    """PP=1's greedy and seeded tokens (and transformers' greedy ones), once per model for all its tests."""
    prompts = _prompts()
    greedy, sampled = _run(LLM(model_dir, **OPTIONS), prompts)
    if against_transformers:
        assert greedy == hf_greedy(Path(model_dir), prompts, GREEDY.max_tokens)
    return greedy, sampled


def _check(model_dir, pp: int = 2, tp: int = 1, against_transformers: bool = True, **extra) -> None:
    prompts = _prompts()
    want_greedy, want_sampled = _reference(str(model_dir), against_transformers)  # PP=1 == transformers
    with LLM(str(model_dir), pipeline_parallel_size=pp, tensor_parallel_size=tp, **OPTIONS, **extra) as llm:
        pids = llm.engine.runner.pool.pids
        assert len(pids) == pp * tp - 1
        got_greedy, got_sampled = _run(llm, prompts)
        stats = llm.stats()
        per_rank = llm.engine.runner.pipeline_stats()  # [compute_s, wait_s, bytes_sent, steps] per rank
        in_flight = llm.engine.runner.in_flight
        pool = llm.engine.kv.pool
        assert pool.num_free == len(pool.blocks)  # no leaked block
    lanes = extra.get("pipeline_virtual_engines", pp)
    if lanes > 1:  # virtual engines: steps of different lanes were in the stages at the same time
        assert in_flight is not None and in_flight.max_in_flight == lanes
    else:
        assert in_flight is None
    assert got_greedy == want_greedy  # and so transformers' tokens, where checked
    assert got_sampled == want_sampled  # seeded sampling: the same tokens as PP=1
    assert stats.preemptions > 0, "the workload must preempt"
    assert stats.cached_prompt_tokens > 0, "the workload must hit the prefix cache"
    assert max(len(p) for p in prompts) > OPTIONS["max_num_batched_tokens"], "a prompt must be chunked"
    assert per_rank[:, 3].tolist() == [stats.steps] * (pp * tp)  # every rank ran every step
    assert (per_rank[: tp * (pp - 1), 2] > 0).all()  # every non-last stage sent activations
    assert per_rank[(pp - 1) * tp, 2] > 0  # the last stage's root sent the logits
    assert_processes_gone(pids)


def test_two_stages_equal_one_and_transformers(llama_dir):
    _check(llama_dir)  # two virtual engines: a step of each lane in flight


@pytest.mark.slow
def test_one_virtual_engine_fills_and_drains_each_step(llama_dir):
    _check(llama_dir, pipeline_virtual_engines=1)  # the earlier design: micro-batches within a step


def test_aborted_lanes_land_and_free_every_block(llama_dir):
    """A stream closed while both lanes have a step in flight: the steps land (no stage is left
    mid-step), every block comes back, and the next call gets exact tokens."""
    with LLM(str(llama_dir), pipeline_parallel_size=2, **OPTIONS) as llm:
        prompts = _prompts()
        stream = llm.generate_stream(prompts, GREEDY)
        next(stream)
        assert llm.engine.lanes is not None and len(llm.engine.lanes.in_flight) == 1
        stream.close()
        pool = llm.engine.kv.pool
        assert not llm.engine.has_unfinished() and not llm.engine.lanes.busy
        assert pool.num_free == len(pool.blocks)
        per_rank = llm.engine.runner.pipeline_stats()
        assert per_rank[:, 3].tolist() == [llm.stats().steps] * 2
        again = [list(o.token_ids) for o in llm.generate(prompts[:3], GREEDY)]
    assert again == _reference(str(llama_dir), True)[0][:3]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mistral-mqa", "qwen2-bias-tied", "qwen3-qknorm-headdim"])
def test_two_stages_on_every_architecture_corner(model_root, name):
    # qwen3 also runs three micro-batches per step (more in flight than stages)
    _check(
        make_model_dir(model_root, name),
        **({"pipeline_micro_batches": 3} if name.startswith("qwen3") else {}),
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["llama-gqa-llama3rope", "mistral-mqa", "qwen2-bias-tied", "qwen3-qknorm-headdim"]
)
def test_two_stages_of_two_tensor_parallel_ranks(model_root, name):
    _check(make_model_dir(model_root, name), pp=2, tp=2)


@pytest.mark.slow
def test_gptq_checkpoint_under_pipeline_parallelism(quant_root):
    from tests.engine.quant_models import make_base
    from tests.engine.quant_packers import Fmt, write_quantized

    quant_dir, _, _ = write_quantized(
        make_base(quant_root, "llama"), quant_root, Fmt("gptq", 4, 32, sym=False, act_order=True)
    )
    _check(quant_dir, against_transformers=False)  # transformers needs optimum to read GPTQ


def test_the_split_gives_the_lm_head_stage_fewer_layers():
    assert stage_layers(4, 2) == [(0, 2), (2, 4)]
    assert stage_layers(5, 3) == [(0, 2), (2, 4), (4, 5)]
    # SmolLM2-135M: 30 layers of 3.5 M parameters, an LM head of 28 M (8 layers' worth)
    split = stage_layers(30, 2, 3_500_000, 28_300_000)
    assert split == [(0, 19), (19, 30)]
    assert stage_layers(2, 2, 1, 100) == [(0, 1), (1, 2)]  # every stage keeps a layer
    with pytest.raises(
        ShardingError,
        match=r"pipeline_parallel_size=3 needs at least one decoder layer per stage; this model has 2",
    ):
        stage_layers(2, 3)


def test_micro_batches_are_contiguous_runs_of_about_equal_tokens():
    qsl = np.array([0, 10, 12, 14, 30, 31, 32])
    assert micro_batches(qsl, 2) == [(0, 3), (3, 6)]
    assert micro_batches(qsl, 1) == [(0, 6)]
    assert micro_batches(np.array([0, 5, 6]), 4) == [(0, 1), (1, 2)]  # never an empty one


def test_too_many_stages_fail_before_any_worker_starts(llama_dir):
    with pytest.raises(ShardingError, match="at least one decoder layer per stage"):
        LLM(str(llama_dir), dtype="float32", device="cpu", pipeline_parallel_size=3)


@pytest.mark.parametrize("value", [0, -1, 2.5, True])
def test_bad_pipeline_parallel_size_is_refused(value):
    with pytest.raises(ValueError, match="pipeline_parallel_size=.* is invalid; expected a positive integer"):
        LLM("tiny", pipeline_parallel_size=value)


def test_killed_stage_is_a_clear_error_within_the_bound(llama_dir):
    llm = LLM(
        str(llama_dir), dtype="float32", device="cpu", pipeline_parallel_size=2, distributed_timeout_s=30
    )
    (worker,) = llm.engine.runner.pool.pids
    long = SamplingParams(max_tokens=200, ignore_eos=True)
    stream = llm.generate_stream(
        random_prompts(4, 5, 20, seed=1), [SamplingParams(max_tokens=2, ignore_eos=True)] + [long] * 3
    )
    killed_at = 0.0
    with pytest.raises(TensorParallelError, match=r"worker rank 1 \(pid \d+\) was killed by SIGKILL"):
        assert next(stream).num_output_tokens == 2
        os.kill(worker, signal.SIGKILL)
        killed_at = time.monotonic()
        for _ in stream:
            pass
    assert time.monotonic() - killed_at < 30, "the error must come within distributed_timeout_s"
    llm.close()
    assert_processes_gone([worker])


@pytest.mark.slow
def test_hung_stage_times_out(llama_dir):
    llm = LLM(
        str(llama_dir),
        dtype="float32",
        device="cpu",
        pipeline_parallel_size=2,
        tensor_parallel_size=2,
        distributed_timeout_s=4,
    )
    pids = llm.engine.runner.pool.pids
    os.kill(pids[-1], signal.SIGSTOP)  # the last stage's second TP rank
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"did not answer within 4 s \(hung\?\)"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    assert time.monotonic() - start < 4 + 10
    llm.close()
    assert_processes_gone(pids)


@pytest.mark.slow
def test_structured_outputs_in_lanes_equal_one_stage():
    """Each lane's grammar masks are filled and taken when its own step is finished, not another's."""
    from tests.engine.structured.test_structured_outputs import PROMPTS, json_params

    options = dict(dtype="float32", device="cpu", max_model_len=256, num_kv_blocks=40, block_size=4)
    params = json_params(temperature=0.9, seed=5)
    want = [o.token_ids for o in LLM("tiny", **options).generate(PROMPTS, params)]
    with LLM("tiny", pipeline_parallel_size=2, **options) as llm:
        got = [o.token_ids for o in llm.generate(PROMPTS, params)]
        stats = llm.stats()
        assert llm.engine.runner.in_flight.max_in_flight == 2
    assert got == want
    assert stats.masked_steps > 0 and stats.preemptions > 0
