"""The dtypes ``EngineConfig.dtype`` names, in one place: their sizes, what ``auto`` means, the torch dtype.

Torch-free at import (planning and the fingerprint resolve a dtype name where torch may be missing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def resolve_dtype_name(dtype: str, on_cuda: bool) -> str:
    """``auto`` is bf16 on CUDA and float32 on CPU; any other name is itself."""
    return ("bfloat16" if on_cuda else "float32") if dtype == "auto" else dtype


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
