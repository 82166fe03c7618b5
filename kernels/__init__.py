"""Kernels layer: torch reference kernels (exported here) and Triton versions chosen by `select`.

Importing this package never imports triton; see kernels.backend.
"""

import sys

if __name__ == "kernels":  # pragma: no cover - only when the checkout's root is on sys.path
    # A source checkout's root on sys.path (`python -m pytest`, `python -m benchmarks...`, PYTHONPATH=.) makes
    # this folder importable as a top-level `kernels`, which shadows the PyPI package of that name that
    # transformers >= 5.25 imports. Give the name back to that package when it is installed.
    from prefixflow.kernels.top_level_name import hand_over_top_level_name

    hand_over_top_level_name(sys.modules)


from prefixflow.kernels.backend import KernelBackend, batch_invariant, select
from prefixflow.kernels.reference import (
    build_rope_cache,
    paged_attention,
    rms_norm,
    rotary,
    silu_and_mul,
    store_kv,
)

__all__ = [
    "KernelBackend",
    "batch_invariant",
    "build_rope_cache",
    "paged_attention",
    "rms_norm",
    "rotary",
    "select",
    "silu_and_mul",
    "store_kv",
]
