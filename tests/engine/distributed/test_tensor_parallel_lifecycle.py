"""Tensor-parallel workers come and go with their LLM, and a failed worker is a clear error, fast."""

from __future__ import annotations

import dataclasses
import gc
import os
import signal
import time

import pytest

from prefixflow.engine import LLM, SamplingParams
from prefixflow.engine.distributed import ShardingError, TensorParallelError
from prefixflow.engine.loading.loader import resolve_model
from tests.engine.hf_models import random_prompts
from tests.engine.tp_support import alive, assert_processes_gone

OPTIONS = dict(dtype="float32", device="cpu", tensor_parallel_size=2)
LONG = SamplingParams(max_tokens=200, ignore_eos=True)


def test_killed_worker_is_a_clear_error_within_the_bound(llama_dir):
    llm = LLM(str(llama_dir), **OPTIONS, distributed_timeout_s=30)
    (worker,) = llm.engine.runner.pool.pids
    short = SamplingParams(max_tokens=2, ignore_eos=True)
    stream = llm.generate_stream(random_prompts(4, 5, 20, seed=1), [short, LONG, LONG, LONG])
    killed_at = 0.0
    with pytest.raises(TensorParallelError, match=r"worker rank 1 \(pid \d+\) was killed by SIGKILL") as err:
        first = next(stream)  # the short request finishes; the long ones are mid-generation
        assert first.num_output_tokens == 2
        os.kill(worker, signal.SIGKILL)
        killed_at = time.monotonic()
        for _ in stream:
            pass
    assert time.monotonic() - killed_at < 30, "the error must come within distributed_timeout_s"
    assert "close it and create a new LLM" in str(err.value)
    with pytest.raises(TensorParallelError):  # the engine stays failed, and says so at once
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    llm.close()
    assert_processes_gone([worker])


@pytest.mark.slow
def test_killed_worker_between_calls(llama_dir):
    """Killed while idle: the next call fails at its first step instead of hanging."""
    llm = LLM(str(llama_dir), **OPTIONS)
    (worker,) = llm.engine.runner.pool.pids
    assert llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))[0].num_output_tokens == 2
    os.kill(worker, signal.SIGKILL)
    assert_processes_gone([worker])
    with pytest.raises(TensorParallelError, match="was killed by SIGKILL"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    llm.close()


def test_a_model_that_cannot_split_fails_before_any_worker_starts(llama_dir):
    before = _children()
    with pytest.raises(
        ShardingError, match=r"num_attention_heads \(4\) is not divisible by tensor_parallel_size=3"
    ):
        LLM(str(llama_dir), dtype="float32", device="cpu", tensor_parallel_size=3)
    assert _children() == before


def test_an_in_memory_model_cannot_be_shared_with_workers(llama_dir):
    with pytest.raises(ValueError, match="in-memory ModelSource cannot be shared"):
        LLM(dataclasses.replace(resolve_model(str(llama_dir)), location=None), **OPTIONS)


@pytest.mark.parametrize("value", [0, -2, 1.5, True])
def test_bad_tensor_parallel_size_is_refused(value):
    with pytest.raises(ValueError, match="tensor_parallel_size=.* is invalid; expected a positive integer"):
        LLM("tiny", tensor_parallel_size=value)


@pytest.mark.slow
def test_hung_worker_times_out(llama_dir):
    llm = LLM(str(llama_dir), **OPTIONS, distributed_timeout_s=4)
    (worker,) = llm.engine.runner.pool.pids
    os.kill(worker, signal.SIGSTOP)
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match=r"did not answer within 4 s \(hung\?\)"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    assert time.monotonic() - start < 4 + 10
    llm.close()
    assert_processes_gone([worker])


@pytest.mark.slow
def test_workers_leave_with_close_context_and_garbage_collection(llama_dir):
    with LLM(str(llama_dir), **OPTIONS) as llm:
        in_context = llm.engine.runner.pool.pids
        assert all(alive(p) for p in in_context)
    assert_processes_gone(in_context)
    with pytest.raises(TensorParallelError, match="closed"):
        llm.generate([[5, 6, 7]], SamplingParams(max_tokens=2))
    llm = LLM(str(llama_dir), **OPTIONS)
    collected = llm.engine.runner.pool.pids
    del llm
    gc.collect()
    assert_processes_gone(collected)


def _children() -> set[int]:
    me = str(os.getpid())
    out = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == me:
                        out.add(int(entry))
            except (FileNotFoundError, IndexError):
                pass
    return out


@pytest.mark.slow
def test_bad_settings_found_while_starting_are_value_errors_and_leave_no_worker(llama_dir):
    before = _children()
    with pytest.raises(ValueError, match="holds fewer than 2 blocks"):
        LLM(str(llama_dir), **OPTIONS, kv_cache_memory_bytes=10)
    assert_processes_gone(list(_children() - before))
