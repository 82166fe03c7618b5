"""Loading llama.cpp GGUF checkpoints (Llama-architecture) into the engine's ModelSource.

Parsing and dequantization use the ``gguf`` package; this package maps names and hyperparameters
onto the Hugging Face layout and undoes llama.cpp's rotary row permutation. Names are imported lazily,
so the torch-free parts (metadata, tokenizer, file lookup) load without torch.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "SUPPORTED_ARCHITECTURES": "prefixflow.engine.gguf.metadata",
    "SUPPORTED_TYPES": "prefixflow.engine.gguf.tensors",
    "find_gguf_file": "prefixflow.engine.gguf.files",
    "load_gguf_source": "prefixflow.engine.gguf.loader",
}

__all__ = ["SUPPORTED_ARCHITECTURES", "SUPPORTED_TYPES", "find_gguf_file", "load_gguf_source"]

if TYPE_CHECKING:
    from prefixflow.engine.gguf.files import find_gguf_file
    from prefixflow.engine.gguf.loader import load_gguf_source
    from prefixflow.engine.gguf.metadata import SUPPORTED_ARCHITECTURES
    from prefixflow.engine.gguf.tensors import SUPPORTED_TYPES


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        value = getattr(import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'prefixflow.engine.gguf' has no attribute {name!r}")
