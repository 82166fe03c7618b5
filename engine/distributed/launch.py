"""Start a worker as a fresh Python process that imports only prefixflow, never the user's script.

Why not ``multiprocessing``'s spawn: it re-runs the parent's ``__main__`` module in every child, so a
script that builds ``LLM(..., tensor_parallel_size=2)`` at top level without an
``if __name__ == "__main__":`` guard would fail (or start workers recursively). Here the child runs a
three-line bootstrap: it takes the parent's ``sys.path`` and then the pickled ``WorkerSpec`` over a
socket pair that also serves as the parent-death signal (see worker.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from multiprocessing.connection import Connection

from prefixflow.engine.distributed.worker import WorkerSpec

_BOOTSTRAP = (
    "import sys\n"
    "from multiprocessing.connection import Connection\n"
    "conn = Connection(int(sys.argv[1]))\n"
    "sys.path[:] = conn.recv()\n"
    "from prefixflow.engine.distributed.worker import serve\n"
    "serve(conn)\n"
)


class WorkerProcess:
    """A launched worker: its pipe to us, and the process (``multiprocessing.Process``-like API)."""

    def __init__(self, spec: WorkerSpec) -> None:
        ours, theirs = socket.socketpair()
        try:
            self._popen = subprocess.Popen(
                [sys.executable, "-c", _BOOTSTRAP, str(theirs.fileno())],
                pass_fds=[theirs.fileno()],
                close_fds=True,
            )
        finally:
            theirs.close()
        self.conn = Connection(ours.detach())
        self.conn.send(list(sys.path))
        self.conn.send(spec)
        self.pid = self._popen.pid
        self.sentinel = _exit_fd(self.pid)

    @property
    def exitcode(self) -> int | None:
        return self._popen.poll()

    def is_alive(self) -> bool:
        return self._popen.poll() is None

    def join(self, timeout: float | None = None) -> None:
        try:
            self._popen.wait(timeout)
        except subprocess.TimeoutExpired:
            pass

    def kill(self) -> None:
        if self.is_alive():
            self._popen.kill()

    def release(self) -> None:
        """Close our file descriptors (the pipe tells the worker to exit)."""
        self.conn.close()
        if self.sentinel >= 0:
            os.close(self.sentinel)
            self.sentinel = -1


def _exit_fd(pid: int) -> int:
    """A descriptor that becomes readable when ``pid`` exits (Linux pidfd), or -1 where there is none
    (the worker's end of the pipe closing is then the only sign of its death)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return -1
