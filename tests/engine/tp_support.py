"""Helpers for tensor-parallel tests: are these processes really gone?"""

from __future__ import annotations

import os
import time


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie awaiting its parent's wait counts as gone)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def assert_processes_gone(pids: list[int], within_s: float = 15.0) -> None:
    deadline = time.monotonic() + within_s
    while any(alive(p) for p in pids):
        if time.monotonic() > deadline:
            raise AssertionError(
                f"processes still running after {within_s} s: {[p for p in pids if alive(p)]}"
            )
        time.sleep(0.05)
