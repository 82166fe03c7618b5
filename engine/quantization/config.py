"""Which ``LinearMethod`` each linear layer gets: from ``config.json``'s ``quantization_config`` or the
``quantization=`` option, decided once, before any weight is read.

``resolve_quantization`` validates everything it can up front and raises ``QuantizationError`` naming
the field (``quantization_config.bits``) and what is supported, so a bad checkpoint fails before
allocation.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from prefixflow.engine.config import CHECKPOINT_QUANTIZATION as CHECKPOINT_METHODS
from prefixflow.engine.config import ONLINE_QUANTIZATION as ONLINE_METHODS
from prefixflow.engine.quantization.method import DenseMethod, LinearMethod

# quant_method values seen in the wild that this engine does not read, with what to use instead
_REFUSED = {
    "bitsandbytes": "bitsandbytes checkpoints are not supported; use a GPTQ/AWQ/compressed-tensors "
    "checkpoint or load the full-precision model with quantization='int8' or 'int4'",
    "exl2": "exllama-v2 (exl2) checkpoints are not supported; use a GPTQ checkpoint",
    "marlin": "marlin-only checkpoints are not supported; use the GPTQ checkpoint they were converted from",
    "gptq_marlin": "marlin-only checkpoints are not supported; use the GPTQ checkpoint they were converted from",
    "awq_marlin": "marlin-only checkpoints are not supported; use the AWQ (gemm) checkpoint",
    "hqq": "HQQ checkpoints are not supported",
    "eetq": "EETQ checkpoints are not supported",
    "fbgemm_fp8": "fbgemm_fp8 checkpoints are not supported; use compressed-tensors FP8 or quantization='fp8'",
}


class QuantizationError(ValueError):
    """A quantization setting or checkpoint format this engine cannot run (the message says which field)."""


class QuantizationConfig:
    """Chooses a method per linear layer. Subclasses: one per checkpoint format or on-the-fly method."""

    method = "none"

    def linear_method(self, prefixes: Sequence[str]) -> LinearMethod:
        """The method for a (possibly merged) layer made of the checkpoint modules ``prefixes``."""
        return DenseMethod()

    def describe(self) -> dict[str, Any]:
        """What decides the numerics (for job fingerprints and reports)."""
        return {"method": self.method}


NO_QUANTIZATION = QuantizationConfig()


def field_error(field: str, value: object, supported: str) -> QuantizationError:
    return QuantizationError(
        f"quantization_config.{field}={value!r} is not supported; supported: {supported}"
    )


def matches(prefix: str, patterns: Sequence[str]) -> bool:
    """``re:<regex>`` patterns match the module name from its start; plain names match as substrings
    (how AutoAWQ, GPTQ and transformers read ``modules_to_not_convert``)."""
    for pattern in patterns:
        if pattern.startswith("re:"):
            if re.match(pattern[3:], prefix):
                return True
        elif pattern and pattern in prefix:
            return True
    return False


def uniform(prefixes: Sequence[str], decide: list[bool], what: str) -> bool:
    """A merged layer is quantized only as a whole: its projections must agree."""
    if all(decide) or not any(decide):
        return decide[0]
    yes = [p for p, d in zip(prefixes, decide) if d]
    no = [p for p, d in zip(prefixes, decide) if not d]
    raise QuantizationError(
        f"{', '.join(yes)} {what} but {', '.join(no)} not; projections merged into one layer "
        "(q/k/v, gate/up) must be quantized alike"
    )


def _gptq(qc: dict[str, Any]) -> QuantizationConfig:
    from prefixflow.engine.quantization.gptq import GPTQConfig

    return GPTQConfig.from_dict(qc)


def _awq(qc: dict[str, Any]) -> QuantizationConfig:
    from prefixflow.engine.quantization.awq import AWQConfig

    return AWQConfig.from_dict(qc)


def _compressed_tensors(qc: dict[str, Any]) -> QuantizationConfig:
    from prefixflow.engine.quantization.compressed_tensors import CompressedTensorsConfig

    if qc.get("sparsity_config") and not qc.get("config_groups"):
        return NO_QUANTIZATION  # 2:4 sparse only: dense weights (with_sparsity wraps them)
    return CompressedTensorsConfig.from_dict({k: v for k, v in qc.items() if k != "sparsity_config"})


# quant_method -> the config of a checkpoint in that format (imported on use: each pulls its kernels).
# GGUF is not here: its blocks combine with on-the-fly methods, so _resolve handles it first.
CHECKPOINT_FORMATS: dict[str, Callable[[dict[str, Any]], QuantizationConfig]] = {
    "gptq": _gptq,
    "awq": _awq,
    "compressed-tensors": _compressed_tensors,
}


def resolve_quantization(
    hf_config: dict[str, Any], requested: str | None = None, sparsity: str | None = None
) -> QuantizationConfig:
    """The config for a model: its checkpoint's ``quantization_config``, or an on-the-fly method, wrapped
    for 2:4 sparsity (the checkpoint's ``sparsity_config`` or ``sparsity="2:4"``: quantization/sparse24.py).
    """
    from prefixflow.engine.quantization.sparse24 import with_sparsity

    qc = hf_config.get("quantization_config")
    return with_sparsity(_resolve(hf_config, requested), qc if isinstance(qc, dict) else None, sparsity)


def _resolve(hf_config: dict[str, Any], requested: str | None = None) -> QuantizationConfig:
    """The config for a model: its checkpoint's ``quantization_config``, or an on-the-fly method.

    ``requested`` is ``EngineConfig.quantization``: None (use what the checkpoint says), one of
    ``int8``/``int4``/``fp8`` (quantize a full-precision checkpoint while loading), ``none`` (every
    layer dense; GGUF blocks are dequantized), or the checkpoint's own method name (accepted as a check).
    """
    qc = hf_config.get("quantization_config")
    if requested is not None and requested not in (*ONLINE_METHODS, "none", *CHECKPOINT_METHODS):
        raise QuantizationError(
            f"quantization={requested!r} is not supported; supported: {', '.join(ONLINE_METHODS)} "
            f"(on the fly), none (dense), or a checkpoint's own {', '.join(CHECKPOINT_METHODS)}"
        )
    if qc is not None and not isinstance(qc, dict):
        raise QuantizationError(f"quantization_config must be a mapping, got {type(qc).__name__}")
    method = str(qc.get("quant_method", "")).lower() if qc else ""
    if requested == "none":  # dense: a full-precision checkpoint, or GGUF blocks dequantized at load
        if qc and method != "gguf":
            raise QuantizationError(
                f"quantization='none' asks for dense weights, but this is a {method or 'quantized'} "
                "checkpoint (it holds no full-precision weights); drop the quantization option"
            )
        return NO_QUANTIZATION
    if method == "gguf":  # set by the GGUF loader: the file's own block types
        from prefixflow.engine.quantization.gguf_blocks import GGUFConfig

        if requested in ONLINE_METHODS:
            from prefixflow.engine.quantization.online import OnlineConfig

            return OnlineConfig(requested)
        if requested is not None and requested != "gguf":  # "gguf": keep the file's blocks packed
            raise QuantizationError(f"quantization={requested!r} does not apply to a GGUF file")
        return GGUFConfig.from_dict(qc or {})
    if qc and requested in ONLINE_METHODS:
        raise QuantizationError(
            f"quantization={requested!r} asks to quantize a checkpoint that is already quantized "
            f"({method or 'quantization_config present'}); drop the quantization option"
        )
    if requested in CHECKPOINT_METHODS and method != requested:
        raise QuantizationError(
            f"quantization={requested!r}, but the checkpoint's quantization_config.quant_method is "
            f"{method or 'absent (a full-precision checkpoint)'}"
        )
    if not qc:
        if requested in ONLINE_METHODS:
            from prefixflow.engine.quantization.online import OnlineConfig

            return OnlineConfig(requested)
        return NO_QUANTIZATION
    if method in _REFUSED:
        raise QuantizationError(f"quantization_config.quant_method={method!r}: {_REFUSED[method]}")
    if method in CHECKPOINT_FORMATS:
        return CHECKPOINT_FORMATS[method](qc)
    raise field_error("quant_method", method, ", ".join(CHECKPOINT_METHODS))
