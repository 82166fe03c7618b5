"""glibc's allocator kept from returning the step's activation buffers to the kernel between steps.

Why: a CPU prefill chunk allocates tensors of 1-25 MiB per op (the gate|up output of 4,096 rows is
24 MiB in bf16). glibc serves blocks above its dynamic mmap threshold with a fresh ``mmap`` and
unmaps them on free, and trims the heap top once more than twice that threshold is free, so the
same pages are faulted in again at the next op: 300,000-500,000 minor page faults per batch-64
prefill of SmolLM2 on the AMX host of benchmarks/RESULTS.md (issue 24, "Ninth round"), about a
tenth of its CPU time. With the mmap threshold pinned at 32 MiB (glibc's ceiling for it) and the
trim threshold at 1 GiB, freed blocks stay in the heap for the next step: under 1,000 faults.

The cost is resident memory: up to 1 GiB of freed heap is kept rather than returned, the
high-water mark of one step's activations in practice. It is process-wide (every allocation of the
process, a peer in the same process included), set once when the first CPU engine loads, and
``PREFIXFLOW_CPU_MALLOC=default`` leaves glibc as it was. Not glibc (musl, macOS): nothing changes.
"""

from __future__ import annotations

import ctypes
import functools
import os
from dataclasses import dataclass

ENV = "PREFIXFLOW_CPU_MALLOC"
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30


@dataclass(frozen=True)
class AllocatorChoice:
    """Whether glibc's thresholds were set for this process, and why (or why not)."""

    tuned: bool
    reason: str


@functools.cache
def tune_cpu_allocator() -> AllocatorChoice:
    """Pin glibc's mmap and trim thresholds once per process (see the module doc)."""
    setting = os.environ.get(ENV, "tuned").strip().lower()
    if setting == "default":
        return AllocatorChoice(False, f"{ENV}=default: glibc's own thresholds")
    if setting != "tuned":
        raise ValueError(f"{ENV} must be 'tuned' or 'default', not {setting!r}")
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return AllocatorChoice(False, "not glibc (no mallopt): the C library's own allocator")
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    if not (mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)):
        return AllocatorChoice(False, "mallopt refused the thresholds: glibc's own")
    return AllocatorChoice(
        True, f"glibc mmap threshold {MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 30} GiB"
    )
