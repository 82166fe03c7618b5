"""What this CPU's torch build can use: the instruction sets that decide which CPU kernel is faster.

One place for the probes, so the engine's dtype choice and the kernels' path choices read the same answer.
The hardware probes are capped by the limits a user sets on torch itself: ``ATEN_CPU_CAPABILITY``
(ATen's vector kernels, e.g. ``avx2``) and ``ONEDNN_MAX_CPU_ISA`` (oneDNN's matmuls, e.g. ``AVX2``).
Why: with those set, torch runs AVX2 code on an AVX-512 CPU, and a path chosen for AVX512-BF16 or AMX
would then run on emulated or scalar code; the caps also let a benchmark measure an AVX2 host's choices.
"""

from __future__ import annotations

import os

import torch

# oneDNN's ISA names in ascending order (the subset that decides the probes below); an unknown value
# limits nothing, as oneDNN itself ignores it.
_ONEDNN_ORDER = (
    "SSE41",
    "AVX",
    "AVX2",
    "AVX2_VNNI",
    "AVX2_VNNI_2",
    "AVX512_CORE",
    "AVX512_CORE_VNNI",
    "AVX512_CORE_BF16",
    "AVX10_1_512",
    "AVX512_CORE_FP16",
    "AVX10_1_512_AMX",
    "AVX512_CORE_AMX",
    "AVX10_1_512_AMX_FP16",
    "AVX512_CORE_AMX_FP16",
)


def _probe(name: str) -> bool:
    return bool(getattr(torch.cpu, name, lambda: False)())


def _onednn_allows(isa: str) -> bool:
    """Whether ``ONEDNN_MAX_CPU_ISA`` (unset, ``ALL`` or unknown: no limit) admits ``isa``."""
    limit = os.environ.get("ONEDNN_MAX_CPU_ISA", os.environ.get("DNNL_MAX_CPU_ISA", "")).strip().upper()
    if limit not in _ONEDNN_ORDER:
        return True
    return _ONEDNN_ORDER.index(limit) >= _ONEDNN_ORDER.index(isa)


def _aten_avx512() -> bool:
    """Whether ATen dispatches its AVX-512 kernels (``ATEN_CPU_CAPABILITY`` can lower it)."""
    get = getattr(torch.backends.cpu, "get_cpu_capability", None)
    return get is None or get() == "AVX512"


def amx_tiles() -> bool:
    """AMX tile instructions (Intel Sapphire Rapids on): oneDNN multiplies bf16 on them."""
    return _probe("_is_amx_tile_supported") and _onednn_allows("AVX512_CORE_AMX") and _aten_avx512()


def avx512_bf16() -> bool:
    """AVX512-BF16 dot products (Zen 4, Cooper Lake on)."""
    return _probe("_is_avx512_bf16_supported") and _onednn_allows("AVX512_CORE_BF16") and _aten_avx512()


def avx2() -> bool:
    """AVX2 (Haswell, Zen 1 on): the ISA the native kernels' 8-lane forms are measured on."""
    return _probe("_is_avx2_supported")


def avx512() -> bool:
    """AVX-512 Foundation (Skylake-SP, Ice Lake, Zen 4 on): 512-bit vectors for the native kernels."""
    return _probe("_is_avx512_supported") and _onednn_allows("AVX512_CORE") and _aten_avx512()
