"""Kernels layer: torch reference kernels (exported here) and Triton versions chosen by `select`.

Importing this package never imports triton; see kernels.backend.
"""

if __name__ != "prefixflow.kernels":  # every file has one import path (docs/architecture.md, Packaging)
    raise ImportError(f"import prefixflow.kernels, not {__name__}: kernels/ is the prefixflow.kernels package")

from prefixflow.kernels.backend import KernelBackend, select  # noqa: E402
from prefixflow.kernels.reference import (  # noqa: E402
    build_rope_cache,
    paged_attention,
    rms_norm,
    rotary,
    silu_and_mul,
    store_kv,
)

__all__ = [
    "KernelBackend",
    "build_rope_cache",
    "paged_attention",
    "rms_norm",
    "rotary",
    "select",
    "silu_and_mul",
    "store_kv",
]
