"""What this CPU's torch build can use: the instruction sets that decide which CPU kernel is faster.

One place for the probes, so the engine's dtype choice and the kernels' path choices read the same answer.
"""

from __future__ import annotations

import torch


def _probe(name: str) -> bool:
    return bool(getattr(torch.cpu, name, lambda: False)())


def amx_tiles() -> bool:
    """AMX tile instructions (Intel Sapphire Rapids on): oneDNN multiplies bf16 on them."""
    return _probe("_is_amx_tile_supported")


def avx512_bf16() -> bool:
    """AVX512-BF16 dot products (Zen 4, Cooper Lake on)."""
    return _probe("_is_avx512_bf16_supported")


def avx512() -> bool:
    """AVX-512 Foundation (Skylake-SP, Ice Lake, Zen 4 on): 512-bit vectors for the native kernels."""
    return _probe("_is_avx512_supported")
