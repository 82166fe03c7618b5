"""The dtypes ``EngineConfig.dtype`` names, in one place: their sizes and the torch dtype (what ``auto``
means is ``loading/model_identity.resolve_dtype``: it depends on the device and the model).

Torch-free at import (planning and the fingerprint use the names where torch may be missing).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def torch_dtype(name: str) -> torch.dtype:
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]
