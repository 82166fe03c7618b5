"""Kernel-test setup: Triton runs under its interpreter on CPU-only machines, test by test.

Every test here uses the suite's ``triton_interpreter`` fixture (tests/conftest.py), which sets
TRITON_INTERPRET=1 for that test only when there is no CUDA device; on a CUDA machine it is left
alone so the same tests compile real kernels.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

_ROOT = str(Path(__file__).resolve().parents[2])
if (
    _ROOT not in sys.path
):  # `pytest tests/kernels` without `python -m`: make kernels/ and benchmarks/ importable
    sys.path.insert(0, _ROOT)

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def _interpreted_on_cpu(triton_interpreter: None) -> None:
    """Kernel tests import and launch Triton kernels: under the interpreter on CPU."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """GPU-marked tests skip, with the reason, where there is no CUDA device."""
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (real-shape test; run by benchmarks/gpu_check.sh)")
    for item in items:
        if "gpu" in item.keywords and str(item.path).startswith(str(Path(__file__).parent)):
            item.add_marker(skip)
