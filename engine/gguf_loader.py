"""Entry point the model loader calls for GGUF paths; the implementation lives in ``engine.gguf``."""

from prefixflow.engine.gguf import (
    SUPPORTED_ARCHITECTURES,
    SUPPORTED_TYPES,
    find_gguf_file,
    is_gguf_path,
    load_gguf_source,
)

__all__ = ["SUPPORTED_ARCHITECTURES", "SUPPORTED_TYPES", "find_gguf_file", "is_gguf_path", "load_gguf_source"]
