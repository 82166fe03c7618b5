"""A real rank executor with no model: exercises the process groups, commands and failure paths.

Used by the runtime tests; lives in an importable module because spawned workers unpickle the
factory by reference.
"""

from __future__ import annotations

import os
import signal
import time

import torch

from prefixflow.engine.distributed.group import ParallelGroup

SUM = 1  # payload: ints; every rank adds (rank + 1) * payload; rank 0 gets the sum
CRASH = 2  # payload: [rank]; that rank raises
HANG = 3  # payload: [rank]; that rank sleeps for a long time
KILL = 4  # payload: [rank]; that rank kills itself with SIGKILL
GATHER = 5  # payload: [n]; every rank contributes [rank] * n, rank 0 gets the concatenation


class ToyExecutor:
    def __init__(self, group: ParallelGroup, fail_on_load: bool = False) -> None:
        if fail_on_load and group.rank == 1:
            raise ValueError("toy load failure on rank 1")
        self.group = group

    def handle(self, command: int, payload: torch.Tensor):
        rank = self.group.rank
        if command == SUM:
            return self.group.all_reduce(payload.float() * (rank + 1))
        if command == GATHER:
            n = int(payload[0])
            return self.group.gather_last_dim(torch.full((2, n), float(rank)))
        if int(payload[0]) == rank:
            if command == CRASH:
                raise ValueError(f"toy crash on rank {rank}")
            if command == HANG:
                time.sleep(3600)
            if command == KILL:
                os.kill(os.getpid(), signal.SIGKILL)
        return self.group.all_reduce(torch.ones(1))


def make_toy(group: ParallelGroup) -> ToyExecutor:
    return ToyExecutor(group)


def make_failing_toy(group: ParallelGroup) -> ToyExecutor:
    return ToyExecutor(group, fail_on_load=True)


def _explode() -> None:
    raise RuntimeError("toy factory cannot be rebuilt in the worker")


class UnpicklableFactory:
    """Pickles fine here, fails to unpickle in the worker (like a factory defined in ``__main__``)."""

    def __reduce__(self):
        return (_explode, ())

    def __call__(self, group: ParallelGroup) -> ToyExecutor:
        return ToyExecutor(group)
