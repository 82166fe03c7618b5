"""Fault injection for tests and drills.

`PREFIXFLOW_FAULT_ONCE=/path/marker`: the first lane that commits a shard while the marker file
does not exist creates it and raises `InjectedFault`. The marker is created exclusively, so the
fault fires exactly once across lanes, threads and processes; delete the file to arm it again.
"""

from __future__ import annotations

import os

FAULT_ONCE_ENV = "PREFIXFLOW_FAULT_ONCE"


class InjectedFault(RuntimeError):
    """Raised by the fault-injection hooks; never raised in normal runs."""


def fail_once_after_commit(lane: int, shard_id: str) -> None:
    """Raise once per marker file, after a lane committed `shard_id`."""
    marker = os.environ.get(FAULT_ONCE_ENV)
    if not marker:
        return
    try:
        with open(marker, "x") as fh:
            fh.write(f"lane {lane} after {shard_id}\n")
    except FileExistsError:
        return
    raise InjectedFault(f"injected fault in lane {lane} after committing shard {shard_id}")
