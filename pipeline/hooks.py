"""Test hook points: let a kill test land exactly inside a flush or a commit.

With ``PREFIXFLOW_TEST_HOOKS=1`` each point prints ``HOOK <name>`` to stderr and sleeps
``PREFIXFLOW_TEST_HOOK_SLEEP`` seconds (default 0.2), so a test watching stderr can SIGKILL the
process while it is paused there; ``PREFIXFLOW_TEST_HOOKS=commit_marker,new_run_recorded`` pauses at
the listed points only. Off (a dictionary lookup) in normal runs.
"""

from __future__ import annotations

import os
import sys
import time

SHARD_POINTS = (
    "flush_begin",  # a part is about to be written
    "flush_mid",  # the part's bytes are encoded, not yet visible
    "flush_end",  # the part is visible in staging (publish: direct, a whole shard: in data/, uncommitted)
    "commit_begin",  # all rows flushed, marker not yet created
    "commit_marker",  # marker created, parts not yet published (a direct part: already in data/)
    "publish_mid",  # some parts published under data/
    "commit_end",  # published, staging not yet cleaned
)
POINTS = (*SHARD_POINTS, "new_run_recorded")  # --new-run: new run record written, old run not yet removed


def hook(name: str) -> None:
    wanted = os.environ.get("PREFIXFLOW_TEST_HOOKS")
    if not wanted or (wanted != "1" and name not in wanted.split(",")):
        return
    print(f"HOOK {name}", file=sys.stderr, flush=True)
    time.sleep(float(os.environ.get("PREFIXFLOW_TEST_HOOK_SLEEP", "0.2")))
