"""Rank 0's side of tensor parallelism: spawn the workers, watch them, turn their failures into errors.

Failure bounds (``timeout_s``, 60 s by default):
- a worker that dies (crash, OOM kill, ``kill -9``) breaks the next collective at once: gloo sees the
  closed connection; on CUDA a monitor thread aborts the NCCL communicator when a worker exits;
- a worker that hangs makes rank 0's collective time out after ``timeout_s``;
- either way the parent raises ``TensorParallelError`` naming the rank, its pid, how it ended and its
  traceback when it sent one, kills the remaining workers and refuses further work.
Workers exit when the pool is closed, garbage-collected, or the parent process dies (see worker.py).
"""

from __future__ import annotations

import os
import signal
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from multiprocessing.connection import Connection, wait
from typing import Any, TypeVar

import torch

from prefixflow.engine.distributed.group import DistributedGroup, ParallelGroup, dist
from prefixflow.engine.distributed.launch import WorkerProcess
from prefixflow.engine.distributed.worker import SHUTDOWN, RankExecutor, WorkerSpec

STARTUP_BOUND_S = 120.0  # spawn + import torch on a loaded machine
EXIT_GRACE_S = 5.0  # for a worker told to exit to do so before it is killed
REPORT_GRACE_S = 2.0  # for a failing worker to send its traceback and exit, before the error is raised
_T = TypeVar("_T")


class TensorParallelError(RuntimeError):
    """A tensor-parallel worker failed to start, crashed or hung; this engine cannot continue."""


class WorkerPool:
    """Ranks 1..world-1 as launched processes, plus rank 0's ``DistributedGroup`` in this process."""

    def __init__(
        self,
        world: int,
        devices: list[torch.device],
        timeout_s: float,
        factory: Callable[[ParallelGroup], RankExecutor],
        num_threads: int | None = None,
    ) -> None:
        if len(devices) != world:
            raise ValueError(f"{len(devices)} devices for tensor_parallel_size={world}")
        self.world = world
        self.timeout_s = timeout_s
        self.failure: TensorParallelError | None = None
        self._closed = False
        self._group: DistributedGroup | None = None
        self._ready = False  # every worker loaded and waits for commands
        self._busy_since: float | None = None  # when the running command started (for the NCCL watch)
        self._busy_bound = timeout_s
        self._hang_seen = False
        self._posted: list[tuple[Any, torch.Tensor]] = []  # broadcasts of posted commands, until taken
        bound = _seconds(timeout_s)
        self._store = dist.TCPStore("127.0.0.1", 0, world, True, timeout=bound, wait_for_workers=False)
        self._procs: list[WorkerProcess] = []
        self._conns: list[Connection] = []
        self._finalizer = weakref.finalize(self, _terminate, self._procs)
        threads = num_threads or torch.get_num_threads()
        for rank in range(1, world):
            spec = WorkerSpec(
                rank, world, self._store.port, str(devices[rank]), timeout_s, threads, os.getpid(), factory
            )
            proc = WorkerProcess(spec)
            self._procs.append(proc)
            self._conns.append(proc.conn)
        self._await("hello", STARTUP_BOUND_S + timeout_s)
        self._group = DistributedGroup(0, world, devices[0], self._store, timeout_s)
        if devices[0].type == "cuda":
            threading.Thread(target=self._watch_nccl, name="prefixflow-tp-monitor", daemon=True).start()

    @property
    def group(self) -> DistributedGroup:
        """Rank 0's process groups (the workers have all joined them once the pool exists)."""
        if self._group is None:
            raise TensorParallelError("the tensor-parallel group was never formed")
        return self._group

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def wait_ready(self) -> None:
        """Block until every worker has loaded its shard (no time bound: loading is as slow as the
        checkpoint is big); a worker that dies or raises meanwhile is an error at once."""
        self._await("ready", None)
        self._ready = True

    def run(
        self, executor: RankExecutor, command: int, payload: torch.Tensor, bound_s: float | None = None
    ) -> object:
        """Broadcast ``command`` to the workers and run rank 0's part of it here. ``bound_s`` (default
        ``timeout_s``) is how long it may run on CUDA before it counts as hung (startup work such as
        graph capture takes longer than a step)."""
        with self.guard():
            self._busy_bound = self.timeout_s if bound_s is None else bound_s
            self._busy_since = time.monotonic()
            try:
                self.group.send_command(command, payload)
                return executor.handle(command, payload)
            finally:
                self._busy_since = None

    def post(self, command: int, payload: torch.Tensor) -> None:
        """Broadcast ``command`` without waiting for the workers to take it (they may still be busy
        with earlier steps: pipeline parallelism keeps steps in flight); rank 0's part is the
        caller's, inside ``guarded``. The NCCL hang watch counts only while rank 0 is inside a call:
        between calls no worker waits on rank 0 with a timeout (pipeline_inflight.py's order), and
        the caller may take its time between engine steps."""
        with self.guard():
            self._busy_bound = self.timeout_s
            self._busy_since = time.monotonic()
            try:
                self._posted = [(w, t) for w, t in self._posted if not w.is_completed()]
                self._posted += self.group.send_command(command, payload, wait=False)
            finally:
                self._busy_since = None

    def guarded(self, work: Callable[[], _T]) -> _T:
        """Run rank 0's side of posted commands under the same failure handling as ``run``."""
        with self.guard():
            self._busy_bound = self.timeout_s
            self._busy_since = time.monotonic()
            try:
                return work()
            finally:
                self._busy_since = None

    def settle(self) -> None:
        """Nothing is in flight any more: wait until the workers took every posted broadcast."""
        self.guarded(self._wait_posted)

    def _wait_posted(self) -> None:
        for work, _ in self._posted:
            work.wait()
        self._posted = []

    @contextmanager
    def guard(self) -> Iterator[None]:
        """Any exception while ranks work together leaves the group out of step: diagnose, stop
        every worker and raise ``TensorParallelError`` (also for every later call)."""
        if self.failure is not None:
            raise self.failure
        if self._closed:
            raise TensorParallelError("the tensor-parallel engine was closed")
        try:
            yield
        except BaseException as exc:
            self.failure = self._diagnose(exc)
            self._kill()
            if not isinstance(exc, Exception):
                raise  # KeyboardInterrupt / SystemExit stay what they are; the engine is unusable all the same
            raise self.failure from exc

    def close(self) -> None:
        """Stop the workers (politely when they are healthy) and release the groups. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self.failure is None and self._group is not None and self._ready:
            try:
                self._group.send_command(SHUTDOWN, torch.empty(0, dtype=torch.int64))
            except Exception:  # noqa: BLE001 - a broken worker is killed below
                pass
        self._finalizer()
        if self._group is not None:
            self._group.close()

    def _kill(self) -> None:
        for proc in self._procs:
            if proc.is_alive():
                proc.kill()
        self._finalizer()
        if self._group is not None:
            self._group.abort()

    def _await(self, kind: str, bound_s: float | None) -> None:
        deadline = None if bound_s is None else time.monotonic() + bound_s
        pending = set(range(len(self._procs)))
        while pending:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                ranks = ", ".join(str(i + 1) for i in sorted(pending))
                self._kill()
                raise TensorParallelError(
                    f"tensor-parallel worker rank(s) {ranks} did not {kind} within {bound_s:.0f} s"
                )
            handles: list[Connection | int] = [self._conns[i] for i in pending]
            handles += [self._procs[i].sentinel for i in pending if self._procs[i].sentinel >= 0]
            for handle in wait(handles, remaining):
                i = next(j for j in pending if handle in (self._conns[j], self._procs[j].sentinel))
                message = _receive(self._conns[i])
                if message is not None and message[0] == kind:
                    pending.discard(i)
                    continue
                if message is not None and message[0] == "hello":
                    continue
                self._procs[i].join(REPORT_GRACE_S)  # its pipe closed: let it finish exiting
                failure = self._describe(i, message[1] if message and message[0] == "error" else None)
                self._kill()
                raise TensorParallelError(f"tensor-parallel startup failed: {failure}")

    def _diagnose(self, exc: BaseException) -> TensorParallelError:
        deadline = time.monotonic() + min(REPORT_GRACE_S, self.timeout_s)
        reports: dict[int, str] = {}
        for i, proc in enumerate(self._procs):  # a crashing worker sends its traceback, then exits
            proc.join(max(0.0, deadline - time.monotonic()))
            message = _receive(self._conns[i]) if self._conns[i].poll(0) else None
            if message is not None and message[0] == "error":
                reports[i] = message[1]
        problems = [self._describe(i, reports.get(i)) for i in range(len(self._procs))]
        dead = [p for p, proc in zip(problems, self._procs) if not proc.is_alive() or "raised" in p]
        cause = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        if dead:
            text = "; ".join(dead)
        elif self._hang_seen or "timed out" in str(exc).lower() or "timeout" in str(exc).lower():
            text = f"a worker did not answer within {self.timeout_s:.0f} s (hung?): " + "; ".join(problems)
        else:
            text = f"the step failed on rank 0 ({cause}); workers: " + "; ".join(problems)
        return TensorParallelError(
            f"tensor parallelism failed: {text}. The engine cannot continue; close it and create a new LLM "
            f"(rank 0 saw {cause})"
        )

    def _describe(self, i: int, traceback_text: str | None) -> str:
        proc = self._procs[i]
        where = f"worker rank {i + 1} (pid {proc.pid})"
        if traceback_text:
            last = traceback_text.strip().splitlines()[-1]
            return f"{where} raised {last}\n{traceback_text}"
        code = proc.exitcode
        if code is None:
            return f"{where} is still running"
        if code < 0:
            return f"{where} was killed by {signal.Signals(-code).name}"
        return f"{where} exited with code {code}"

    def _watch_nccl(self) -> None:
        """CUDA only: NCCL notices neither a dead peer nor a hung one by itself, and its own watchdog
        is told not to act (group.py), so this thread aborts the communicators when a worker exits or a
        command outlives ``timeout_s``; rank 0's wait then fails inside ``guard`` with a clear error."""
        sentinels = [p.sentinel for p in self._procs if p.sentinel >= 0]
        while not self._closed and self.failure is None:
            died = bool(wait(sentinels, 0.5)) or not all(p.is_alive() for p in self._procs)
            busy = self._busy_since
            hung = busy is not None and time.monotonic() - busy > self._busy_bound
            if (died or hung) and not self._closed:
                self._hang_seen = hung and not died
                self.group.abort()
                return


def _receive(conn: Connection) -> tuple[str, Any] | None:
    try:
        if conn.poll(0):
            return conn.recv()  # type: ignore[no-any-return]
    except (EOFError, OSError):
        pass
    return None


def _terminate(procs: list[WorkerProcess]) -> None:
    """Closing our pipe ends tells each worker to exit; kill what has not after a grace period."""
    for proc in procs:
        proc.conn.close()
    deadline = time.monotonic() + EXIT_GRACE_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join(EXIT_GRACE_S)
        proc.release()


def _seconds(value: float) -> timedelta:
    return timedelta(seconds=value)
