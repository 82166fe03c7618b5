"""Kernels layer: torch reference kernels (exported here) and Triton versions chosen by `select`.

Importing this package never imports triton; see kernels.backend.
"""

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
