"""The collectives a tensor-parallel model needs, over one code path for NCCL (CUDA) and gloo (CPU).

Two process groups per engine, both private to it (never torch's global default group, so several
engines, with or without TP, can live in one process):

- ``compute``: NCCL on CUDA, gloo on CPU. Carries the per-layer all-reduces and the logits gather.
  Its timeout bounds how long any rank waits for a peer inside a step, which is how a hung rank
  becomes an error instead of a hang.
- ``control``: always gloo over CPU tensors. Rank 0 broadcasts each command (a step's flattened inputs)
  on it. Workers wait on it while the engine idles, so their side has no practical timeout; rank 0's
  side keeps the bound.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed

# torch's type stubs do not describe the process-group backend classes (allreduce, gather, abort...)
# nor re-export the store types, so the backend objects are typed loosely here.
dist: Any = torch.distributed

_NCCL_ERROR_HANDLING = "TORCH_NCCL_ASYNC_ERROR_HANDLING"
# How long a worker waits for the next command: the engine may idle between batches for days.
WORKER_IDLE_TIMEOUT = timedelta(days=365)
# A worker joins the process groups right after its own imports and may wait for slower peers.
RENDEZVOUS_TIMEOUT = timedelta(seconds=300)


@dataclass
class CollectiveStats:
    """Host time spent inside collectives (on CUDA the ops are asynchronous, so this is launch time)."""

    all_reduce_s: float = 0.0
    all_reduce_calls: int = 0
    gather_s: float = 0.0
    broadcast_s: float = 0.0


class ParallelGroup:
    """One rank's view of its tensor-parallel group. With ``world == 1`` every collective is a no-op,
    so the model code is the same with and without TP."""

    def __init__(self, rank: int = 0, world: int = 1, device: torch.device | None = None) -> None:
        self.rank = rank
        self.world = world
        self.device = device or torch.device("cpu")
        self.stats = CollectiveStats()

    @property
    def is_first(self) -> bool:
        return self.rank == 0

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sum ``tensor`` over the ranks, in place; returns it."""
        return tensor

    def gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor | None:
        """Concatenate every rank's ``tensor`` along the last dimension on rank 0 (None elsewhere)."""
        return tensor

    def all_reduce_min(self, value: int) -> int:
        return value

    def close(self) -> None:
        pass


class DistributedGroup(ParallelGroup):
    """A rank of a multi-process group rendezvousing through a ``TCPStore``."""

    def __init__(self, rank: int, world: int, device: torch.device, store: Any, timeout_s: float) -> None:
        super().__init__(rank, world, device)
        bound = timedelta(seconds=timeout_s)
        # Rank 0 joins last (after every worker said hello), so only workers may wait long here.
        join = bound if rank == 0 else RENDEZVOUS_TIMEOUT
        self.compute = _new_group(device, dist.PrefixStore("compute", store), rank, world, join)
        self.control = dist.ProcessGroupGloo(dist.PrefixStore("control", store), rank, world, join)
        self.compute._set_default_timeout(bound)
        self.control._set_default_timeout(bound if rank == 0 else WORKER_IDLE_TIMEOUT)
        self._store = store  # rank 0 hosts the store server: keep it alive as long as the groups

    def all_reduce(self, tensor: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        self.compute.allreduce([tensor]).wait()
        self.stats.all_reduce_s += time.perf_counter() - start
        self.stats.all_reduce_calls += 1
        return tensor

    def gather_last_dim(self, tensor: torch.Tensor) -> torch.Tensor | None:
        start = time.perf_counter()
        tensor = tensor.contiguous()
        parts = [torch.empty_like(tensor) for _ in range(self.world)] if self.rank == 0 else []
        opts = dist.GatherOptions()
        opts.rootRank = 0
        self.compute.gather([parts] if self.rank == 0 else [], [tensor], opts).wait()
        self.stats.gather_s += time.perf_counter() - start
        return torch.cat(parts, dim=-1) if self.rank == 0 else None

    def all_reduce_min(self, value: int) -> int:
        t = torch.tensor([value], dtype=torch.int64, device=self.device)
        opts = dist.AllreduceOptions()
        opts.reduceOp = dist.ReduceOp.MIN
        self.compute.allreduce([t], opts).wait()
        return int(t.item())

    def send_command(
        self, command: int, payload: torch.Tensor, wait: bool = True
    ) -> list[tuple[Any, torch.Tensor]]:
        """Rank 0: broadcast a command and its int64 payload (any length: the header carries it).

        ``wait=False`` returns at once with the broadcasts' (work, tensor) pairs, for a step sent while
        the workers are still busy with earlier ones (pipeline parallelism): the caller keeps the pairs
        (the tensors must outlive the sends) and waits for them later. Commands are taken in order."""
        start = time.perf_counter()
        payload = payload.to(torch.int64).contiguous()
        header = torch.tensor([command, payload.numel()], dtype=torch.int64)
        works = [(self._broadcast_start(header), header)]
        if payload.numel():
            works.append((self._broadcast_start(payload), payload))
        if wait:
            for work, _ in works:
                work.wait()
            works = []
        self.stats.broadcast_s += time.perf_counter() - start
        return works

    def receive_command(self) -> tuple[int, torch.Tensor]:
        """Workers: block until rank 0 sends the next command."""
        header = torch.empty(2, dtype=torch.int64)
        self._broadcast(header)
        payload = torch.empty(int(header[1]), dtype=torch.int64)
        if payload.numel():
            self._broadcast(payload)
        return int(header[0]), payload

    def _broadcast(self, tensor: torch.Tensor) -> None:
        self._broadcast_start(tensor).wait()

    def _broadcast_start(self, tensor: torch.Tensor) -> Any:
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        return self.control.broadcast([tensor], opts)

    def abort(self) -> None:
        """Unblock anything waiting on a peer that is gone (best effort: NCCL needs it, gloo errors anyway)."""
        for pg in (self.compute, self.control):
            try:
                pg.abort()
            except Exception:  # noqa: BLE001 - abort is a last resort on a group already broken
                pass

    def close(self) -> None:
        for pg in (self.compute, self.control):
            try:
                pg.shutdown()
            except Exception:  # noqa: BLE001 - shutting down a group whose peers are gone
                pass


def _new_group(device: torch.device, store: Any, rank: int, world: int, join: timedelta) -> Any:
    if device.type == "cuda":
        nccl = getattr(dist, "ProcessGroupNCCL", None)
        if nccl is None:
            raise RuntimeError("this torch build has no NCCL; tensor parallelism on CUDA needs it")
        opts = nccl.Options()
        opts._timeout = join
        # NCCL's watchdog would otherwise end this whole process when a peer hangs; the pool's monitor
        # aborts the group instead, so the engine raises. Read once, when the group is made.
        saved = os.environ.get(_NCCL_ERROR_HANDLING)
        os.environ[_NCCL_ERROR_HANDLING] = "0"
        try:
            return nccl(store, rank, world, opts)
        finally:
            if saved is None:
                del os.environ[_NCCL_ERROR_HANDLING]
            else:
                os.environ[_NCCL_ERROR_HANDLING] = saved
    return dist.ProcessGroupGloo(store, rank, world, join)
