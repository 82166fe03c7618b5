"""The worker runtime with a toy executor: commands, collectives, and every way a worker can fail."""

from __future__ import annotations

import os
import time

import pytest
import torch

from prefixflow.engine.distributed.pool import TensorParallelError, WorkerPool
from tests.engine.distributed import toy_executor as toy
from tests.engine.tp_support import assert_processes_gone


def _pool(
    world: int = 2, timeout_s: float = 30.0, factory=toy.make_toy
) -> tuple[WorkerPool, toy.ToyExecutor]:
    pool = WorkerPool(world, [torch.device("cpu")] * world, timeout_s, factory, num_threads=1)
    executor = factory(pool.group)
    pool.wait_ready()
    return pool, executor


def _gone(pids: list[int]) -> bool:
    assert_processes_gone(pids)
    return True


def test_commands_reach_workers_and_collectives_sum_and_gather():
    pool, executor = _pool()
    try:
        out = pool.run(executor, toy.SUM, torch.tensor([1, 2, 3]))
        assert out.tolist() == [3.0, 6.0, 9.0]  # rank 0 * 1 + rank 1 * 2
        big = torch.arange(300_000)  # no fixed cap on a step's size
        assert torch.equal(pool.run(executor, toy.SUM, big), big.float() * 3)
        gathered = pool.run(executor, toy.GATHER, torch.tensor([3]))
        assert gathered.tolist() == [[0, 0, 0, 1, 1, 1]] * 2
    finally:
        pids = pool.pids
        pool.close()
    assert _gone(pids)


@pytest.mark.slow
def test_worker_exception_is_reported_with_its_traceback():
    pool, executor = _pool()
    pids = pool.pids
    with pytest.raises(TensorParallelError, match=r"worker rank 1 .* raised ValueError: toy crash on rank 1"):
        pool.run(executor, toy.CRASH, torch.tensor([1]))
    with pytest.raises(TensorParallelError):  # broken for good, at once
        pool.run(executor, toy.SUM, torch.tensor([1]))
    pool.close()
    assert _gone(pids)


@pytest.mark.slow
def test_killed_worker_is_an_error_at_once():
    pool, executor = _pool()
    pids = pool.pids
    start = time.monotonic()
    with pytest.raises(TensorParallelError, match="worker rank 1 .* was killed by SIGKILL"):
        pool.run(executor, toy.KILL, torch.tensor([1]))
    assert time.monotonic() - start < pool.timeout_s
    pool.close()
    assert _gone(pids)


@pytest.mark.slow
def test_hung_worker_times_out_within_the_bound():
    pool, executor = _pool(timeout_s=3.0)
    pids = pool.pids
    with pytest.raises(TensorParallelError, match=r"did not answer within 3 s"):
        pool.run(executor, toy.HANG, torch.tensor([1]))
    pool.close()
    assert _gone(pids)


@pytest.mark.slow
def test_worker_failing_to_load_fails_startup():
    with pytest.raises(TensorParallelError, match="startup failed: worker rank 1 .* toy load failure"):
        _pool(factory=toy.make_failing_toy)


@pytest.mark.slow
def test_a_spec_the_worker_cannot_unpickle_fails_startup_with_its_traceback():
    with pytest.raises(
        TensorParallelError, match="startup failed: worker rank 1 .* raised RuntimeError: toy factory cannot"
    ):
        _pool(factory=toy.UnpicklableFactory())


@pytest.mark.slow
def test_garbage_collected_pool_takes_its_workers_with_it():
    pool, _ = _pool()
    pids = pool.pids
    del pool, _
    import gc

    gc.collect()
    assert _gone(pids)


PARENT_SCRIPT = """
import os, signal, sys, torch
from prefixflow.engine.distributed.pool import WorkerPool
from tests.engine.distributed import toy_executor as toy
from tests.engine.tp_support import assert_processes_gone
pool = WorkerPool(2, [torch.device("cpu")] * 2, 30.0, toy.make_toy, num_threads=1)
executor = toy.make_toy(pool.group)
pool.wait_ready()
print(pool.pids[0], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.slow
def test_workers_exit_when_the_parent_is_killed():
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", PARENT_SCRIPT], capture_output=True, text=True, timeout=120, env=os.environ
    )
    assert proc.returncode == -9, proc.stderr
    worker = int(proc.stdout.split()[0])
    assert _gone([worker]), f"worker {worker} outlived its parent"
