"""Loading llama.cpp GGUF checkpoints (Llama-architecture) into the engine's ModelSource.

Parsing and dequantization use the ``gguf`` package; this package maps names and hyperparameters
onto the Hugging Face layout and undoes llama.cpp's rotary row permutation.
"""

from prefixflow.engine.gguf.files import find_gguf_file
from prefixflow.engine.gguf.loader import load_gguf_source
from prefixflow.engine.gguf.metadata import SUPPORTED_ARCHITECTURES
from prefixflow.engine.gguf.tensors import SUPPORTED_TYPES

__all__ = ["SUPPORTED_ARCHITECTURES", "SUPPORTED_TYPES", "find_gguf_file", "load_gguf_source"]
