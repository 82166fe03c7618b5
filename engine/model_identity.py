"""What a model argument refers to, computed cheaply (no weights loaded), for job fingerprints.

The pipeline stores this at the output root before any engine starts, so a run resumed against
different weights, a different file at the same path, or another dtype is refused instead of
silently mixing outputs. It also resolves bad model arguments early, with the loader's message.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _file_digest(path: Path, span: int = 1 << 20) -> str:
    """Size plus the first and last MiB: cheap, and changes whenever a checkpoint is replaced."""
    h = hashlib.sha256(str(path.stat().st_size).encode())
    with open(path, "rb") as f:
        h.update(f.read(span))
        if path.stat().st_size > span:
            f.seek(-span, 2)
            h.update(f.read(span))
    return h.hexdigest()[:16]


def resolve_dtype(dtype: str = "auto", device: str = "auto") -> str:
    on_cuda = device == "cuda" or (device == "auto" and torch.cuda.is_available())
    return ("bfloat16" if on_cuda else "float32") if dtype == "auto" else dtype


def describe_model(
    model: str, dtype: str = "auto", device: str = "auto", quantization: str | None = None
) -> dict[str, Any]:
    """Identity of ``model`` (preset, embedded, HF directory or GGUF), the dtype it would run in, its
    quantization method and ``weight_bytes`` (what its parameters take in that dtype and method,
    from the layer shapes alone: no weight is read).

    Raises the loader's ``ModelNotFoundError`` (a ValueError naming what is accepted) when ``model``
    names nothing loadable, and ``QuantizationError`` for a quantization it cannot run.
    """
    out, hf_config = _identity(model, dtype, device)
    return {**out, **describe_weights(hf_config(), out["dtype"], quantization)}


def describe_weights(hf_config: dict[str, Any], dtype: str, quantization: str | None) -> dict[str, Any]:
    """``quantization`` (the method's settings) and ``weight_bytes``, from a model built on the meta device."""
    from prefixflow.engine.model_config import ModelConfig
    from prefixflow.engine.models.llama import LlamaForCausalLM
    from prefixflow.engine.quantization import resolve_quantization
    from prefixflow.engine.quantization.report import weight_bytes

    quant = resolve_quantization(hf_config, quantization)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    with torch.device("meta"):
        model = LlamaForCausalLM(ModelConfig.from_hf(hf_config), torch_dtype, quant)
    return {"quantization": quant.describe(), "weight_bytes": weight_bytes(model)}


def _identity(model: str, dtype: str, device: str) -> tuple[dict[str, Any], Callable[[], dict[str, Any]]]:
    """The identity fields and a reader of the model's HF-shaped config."""
    from prefixflow.engine import embedded, presets
    from prefixflow.engine.loader import ModelNotFoundError

    out: dict[str, Any] = {"model": str(model), "dtype": resolve_dtype(dtype, device)}
    path = Path(str(model)).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        files = sorted(path.glob("*.safetensors"))
        out["format"] = "hf"
        out["config"] = hashlib.sha256((path / "config.json").read_bytes()).hexdigest()[:16]
        out["weights"] = {f.name: _file_digest(f) for f in files}
        return out, lambda: dict(json.loads((path / "config.json").read_text()))
    gguf = None
    if path.is_file() and path.suffix.lower() == ".gguf":
        gguf = path
    elif path.is_dir():
        found = sorted(path.glob("*.gguf"))
        if len(found) == 1:
            gguf = found[0]
    elif str(model) in embedded.EMBEDDED_MODELS:
        gguf = embedded.resolve_embedded(str(model))
    if gguf is not None:
        file = gguf
        out = {**out, "format": "gguf", "file": gguf.name, "digest": _file_digest(gguf)}
        return out, lambda: _gguf_config(file)
    if str(model) in presets.available_presets():
        preset = presets.load_preset(str(model))
        blob = json.dumps(preset, sort_keys=True).encode()
        out = {**out, "format": "preset", "preset": hashlib.sha256(blob).hexdigest()[:16]}
        return out, lambda: presets.hf_config_of(preset)
    from prefixflow.engine.loader import resolve_model

    resolve_model(str(model))  # raises with the precise message for a bad path
    raise ModelNotFoundError(f"model {model!r} could not be identified")


def _gguf_config(file: Path) -> dict[str, Any]:
    """The HF-shaped config the GGUF loader would build, with the file's tensor types."""
    from gguf import GGUFReader

    from prefixflow.engine.gguf.metadata import build_hf_config
    from prefixflow.engine.gguf.tensors import tensor_types

    reader = GGUFReader(file)
    cfg = build_hf_config(reader, torch.float32)
    cfg["quantization_config"] = {"quant_method": "gguf", "tensor_types": tensor_types(reader)}
    return cfg
