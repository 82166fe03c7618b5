"""Kernel-test setup: Triton runs under its interpreter on CPU-only machines.

triton 3.x reads TRITON_INTERPRET when a kernel is decorated (`triton.knobs.runtime.interpret`,
looked up from the environment at `@triton.jit` time), i.e. when a kernels.triton_* module is first
imported. Setting it here, before any test module imports those, makes the kernels interpreted.
On a CUDA machine it is left alone so the same tests compile real kernels.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"

_ROOT = str(Path(__file__).resolve().parents[2])
if (
    _ROOT not in sys.path
):  # `pytest tests/kernels` without `python -m`: make kernels/ and benchmarks/ importable
    sys.path.insert(0, _ROOT)

import pytest  # noqa: E402


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU-marked tests skip, with the reason, where there is no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (real-shape test; run by benchmarks/gpu_check.sh)")
    for item in items:
        if "gpu" in item.keywords and str(item.path).startswith(str(Path(__file__).parent)):
            item.add_marker(skip)
