"""The body of a tensor-parallel worker process (ranks 1..N-1).

A worker builds its rank's executor (its slice of the model and KV cache), then repeats what rank 0
broadcasts until told to stop. It never holds request objects: each command is an int64 tensor.
It reports to the parent over a pipe (``hello`` before the rendezvous, ``ready`` after loading,
``error`` with its traceback when anything raises) and exits on its own when the parent goes away.
"""

from __future__ import annotations

import os
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Protocol

import torch

from prefixflow.engine.distributed.group import RENDEZVOUS_TIMEOUT, DistributedGroup, ParallelGroup, dist

SHUTDOWN = 0  # command 0 is reserved: the worker leaves its loop
PARENT_POLL_S = 1.0


class RankExecutor(Protocol):
    """What every rank runs for a command; rank 0 runs the same object in the engine process."""

    def handle(self, command: int, payload: torch.Tensor) -> object: ...


@dataclass(frozen=True)
class WorkerSpec:
    """Everything a worker needs, picklable (``factory`` is a module-level callable or a partial)."""

    rank: int
    world: int
    store_port: int
    device: str
    timeout_s: float
    num_threads: int
    parent_pid: int
    factory: Callable[[ParallelGroup], RankExecutor]


def serve(conn: Connection) -> None:
    """Entry point of a launched worker (launch.py): receive the spec, then run."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle; it stops us
    try:
        spec = conn.recv()  # unpickling imports the executor factory's module
    except BaseException:  # noqa: BLE001 - reported to the parent, which raises it
        _report(conn, traceback.format_exc())
        os._exit(1)
    worker_main(spec, conn)


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    watch_parent(conn, spec.parent_pid)
    group: DistributedGroup | None = None
    try:
        torch.set_num_threads(max(1, spec.num_threads))
        device = torch.device(spec.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)

        conn.send(("hello", os.getpid()))
        store = dist.TCPStore("127.0.0.1", spec.store_port, spec.world, False, timeout=RENDEZVOUS_TIMEOUT)
        group = DistributedGroup(spec.rank, spec.world, device, store, spec.timeout_s)
        executor = spec.factory(group)
        conn.send(("ready", None))
        with torch.inference_mode():
            while True:
                command, payload = group.receive_command()
                if command == SHUTDOWN:
                    break
                executor.handle(command, payload)
    except BaseException:  # noqa: BLE001 - everything goes to the parent, then the process ends
        _report(conn, traceback.format_exc())
        os._exit(1)
    finally:
        if group is not None:
            group.close()
    conn.close()


def watch_parent(conn: Connection, parent_pid: int) -> threading.Thread:
    """Exit this process as soon as the parent is gone: its end of the pipe closes (death, ``close()``,
    garbage collection) or, if some other process still holds that end, the parent pid changes."""

    def run() -> None:
        while True:
            try:
                if conn.poll(PARENT_POLL_S):
                    conn.recv()  # the parent never sends: data or EOF both mean "go away"
                    os._exit(0)
            except (EOFError, OSError):
                os._exit(0)
            if os.getppid() != parent_pid:
                os._exit(0)

    thread = threading.Thread(target=run, name="prefixflow-parent-watch", daemon=True)
    thread.start()
    return thread


def _report(conn: Connection, text: str) -> None:
    try:
        conn.send(("error", text))
    except (OSError, EOFError, BrokenPipeError):
        pass
