"""Quantized linear layers: checkpoint formats (GPTQ, AWQ, compressed-tensors, GGUF blocks), on-the-fly
int8/int4/fp8, and the ``LinearMethod`` seam through which the model uses them (see docs/models.md)."""

from prefixflow.engine.config import CHECKPOINT_QUANTIZATION as CHECKPOINT_METHODS
from prefixflow.engine.config import ONLINE_QUANTIZATION as ONLINE_METHODS
from prefixflow.engine.quantization.config import (
    NO_QUANTIZATION,
    QuantizationConfig,
    QuantizationError,
    resolve_quantization,
)
from prefixflow.engine.quantization.method import DenseMethod, KernelContext, KernelMethod, LinearMethod
from prefixflow.engine.quantization.params import CheckpointError, ParamSpec

__all__ = [
    "CHECKPOINT_METHODS",
    "NO_QUANTIZATION",
    "ONLINE_METHODS",
    "CheckpointError",
    "DenseMethod",
    "KernelContext",
    "KernelMethod",
    "LinearMethod",
    "ParamSpec",
    "QuantizationConfig",
    "QuantizationError",
    "resolve_quantization",
]
