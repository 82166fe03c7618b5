"""How many CPU threads the engine's matmuls get, and how many are left for the workers beside them.

On a CPU every matmul is an OpenMP parallel region whose threads meet at a barrier per op (about 15
ops per layer per step). A thread that loses its core to anything else (the grammar worker filling
masks, the tokenizer, the pipeline's writer and lease threads, another process) stalls every op of
the step, so a compute pool as wide as the machine is the slowest choice as soon as anything else
runs: ``prefixflow demo`` on the 2-core host of benchmarks/RESULTS.md issue 24 took 563 s and 271
CPU-seconds with 2 compute threads, 163 s and 63 CPU-seconds with 1 (load average 6-7). So the
default leaves cores for the workers: ``workers = max(1, cores // 8)``, ``compute = cores - workers``
(1 + 1 on 2 cores, 7 + 1 on 8, 14 + 2 on 16), where ``cores`` is what this process may run on (its
CPU affinity, capped by a cgroup CPU quota), not the machine's count.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

MAX_GRAMMAR_THREADS = 8


@dataclass(frozen=True)
class ThreadPlan:
    """``compute``: torch intra-op threads; ``workers``: cores left for grammar, tokenizer and I/O."""

    cores: int
    compute: int
    workers: int
    reason: str


def usable_cores() -> int:
    """The cores this process may use: its affinity mask, capped by a cgroup v2/v1 CPU quota."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_limit()
    return max(1, min(cores, quota) if quota is not None else cores)


def cgroup_cpu_limit(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Whole CPUs a cgroup quota allows (rounded up), or None without a quota."""
    try:
        v2 = root / "cpu.max"
        if v2.is_file():
            quota, period = v2.read_text().split()[:2]
            return None if quota == "max" else max(1, math.ceil(int(quota) / int(period)))
        v1 = root / "cpu" / "cpu.cfs_quota_us"
        if v1.is_file():
            q = int(v1.read_text())
            p = int((root / "cpu" / "cpu.cfs_period_us").read_text())
            return None if q <= 0 else max(1, math.ceil(q / p))
    except (OSError, ValueError):
        return None
    return None


def thread_plan(threads: int | None = None, cores: int | None = None) -> ThreadPlan:
    """``threads`` when given (a user's choice, kept as is); else the rule of the module docstring."""
    cores = usable_cores() if cores is None else max(1, cores)
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads must be at least 1, got {threads}")
        return ThreadPlan(cores, threads, max(0, cores - threads), "set by the user")
    if cores == 1:
        return ThreadPlan(1, 1, 0, "1 usable core: compute and workers share it")
    workers = max(1, cores // 8)
    return ThreadPlan(
        cores, cores - workers, workers, f"{cores} usable cores, {workers} left for grammar/tokenizer/I/O"
    )


def set_cpu_threads(threads: int | None = None) -> ThreadPlan:
    """Apply ``thread_plan(threads)`` to torch (process-wide). With ``threads`` None and
    ``OMP_NUM_THREADS`` set, torch's own count (which honours it) is kept and reported."""
    import torch

    if threads is None and os.environ.get("OMP_NUM_THREADS"):
        n = torch.get_num_threads()
        cores = usable_cores()
        return ThreadPlan(cores, n, max(0, cores - n), "OMP_NUM_THREADS")
    plan = thread_plan(threads)
    torch.set_num_threads(plan.compute)
    return plan


def grammar_threads() -> int:
    """Threads for the grammar compiler and mask filling: the cores torch's pool leaves free (at least 1)."""
    import torch

    return max(1, min(MAX_GRAMMAR_THREADS, usable_cores() - torch.get_num_threads()))
