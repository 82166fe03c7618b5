"""How much host memory the engine's host KV tier should get (issue 28), for the advisor's Q4.

The device pool should keep the job's working set: every shared prompt head the prefix cache keeps
reusing plus the sequences running at once. What does not fit is evicted (and recomputed on its next
hit) or preempted (and recomputed on resume). The host tier holds that excess instead, so the
recommendation is the excess plus a quarter for headroom, whole GiB, capped at half the host's memory
(the pipeline, the tokenizer and the OS need the rest). A pool that holds the working set needs none.
"""

from __future__ import annotations

import os

GIB = 2**30
HOST_SHARE = 0.5
HEADROOM = 1.25


def host_memory_bytes() -> int:
    """This machine's physical memory (the advisor assumes a lane's host is alike); 0 if unknown."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def recommend_offload_bytes(
    working_tokens: int, pool_tokens: int, kv_bytes_per_token: float, host_bytes: int
) -> int:
    """``kv_offload_bytes`` for a working set of ``working_tokens`` over a pool of ``pool_tokens``."""
    excess = working_tokens - pool_tokens
    if excess <= 0 or kv_bytes_per_token <= 0:
        return 0
    want = -(-int(excess * kv_bytes_per_token * HEADROOM) // GIB) * GIB
    cap = int(host_bytes * HOST_SHARE) // GIB * GIB
    return max(0, min(want, cap))
