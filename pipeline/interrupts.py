"""Ctrl-C and SIGTERM end a command the same way: a KeyboardInterrupt that unwinds (leases are released,
nothing half-written is visible) and one line saying how to resume, then exit 128 + signal number."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

INTERRUPTED_HINT = "re-run the same command to resume"


class Terminated(KeyboardInterrupt):
    """SIGTERM (or SIGHUP) delivered as an interrupt, so that it unwinds like Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def _raise(signum: int, frame: FrameType | None) -> None:
    raise Terminated(signum)


@contextmanager
def interruptible() -> Iterator[None]:
    """Within the block SIGTERM and SIGHUP raise Terminated in the main thread (Ctrl-C already raises
    KeyboardInterrupt); the previous handlers come back afterwards. A no-op off the main thread."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    saved = {sig: signal.signal(sig, _raise) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
