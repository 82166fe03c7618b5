"""What a model argument refers to, computed cheaply (no weights loaded), for job fingerprints.

The pipeline stores this at the output root before any engine starts, so a run resumed against
different weights, a different file at the same path, or another dtype is refused instead of
silently mixing outputs. It also resolves bad model arguments early, with the loader's message.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

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


def describe_model(model: str, dtype: str = "auto", device: str = "auto") -> dict:
    """Identity of ``model`` (preset, embedded, HF directory or GGUF) plus the dtype it would run in.

    Raises the loader's ``ModelNotFoundError`` (a ValueError naming what is accepted) when ``model``
    names nothing loadable.
    """
    from prefixflow.engine import embedded, presets
    from prefixflow.engine.loader import ModelNotFoundError

    out: dict = {"model": str(model), "dtype": resolve_dtype(dtype, device)}
    path = Path(str(model)).expanduser()
    if path.is_dir() and (path / "config.json").exists():
        files = sorted(path.glob("*.safetensors"))
        out["format"] = "hf"
        out["config"] = hashlib.sha256((path / "config.json").read_bytes()).hexdigest()[:16]
        out["weights"] = {f.name: _file_digest(f) for f in files}
        return out
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
        return {**out, "format": "gguf", "file": gguf.name, "digest": _file_digest(gguf)}
    if str(model) in presets.available_presets():
        blob = json.dumps(presets.load_preset(str(model)), sort_keys=True).encode()
        return {**out, "format": "preset", "preset": hashlib.sha256(blob).hexdigest()[:16]}
    from prefixflow.engine.loader import resolve_model

    resolve_model(str(model))  # raises with the precise message for a bad path
    raise ModelNotFoundError(f"model {model!r} could not be identified")
