"""The one place a model argument is resolved and identified: loading, ``describe_model`` and the
pipeline's job fingerprint all go through ``locate_model`` and ``identity_of``.

``locate_model`` finds what an argument names (HF directory, GGUF file, preset, embedded model)
without loading anything and fails fast, with what to do, on what the loader would refuse.
``identity_of`` names everything that decides outputs: weights, config, tokenizer, chat template,
generation config and the dtype the model runs in. It stays cheap: small files are hashed whole,
weight files by size plus their first and last MiB, a GGUF file by its whole header (hyperparameters,
tokenizer, chat template, tensor table) plus size and the first and last MiB of its tensor data.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

SPAN = 1 << 20
# Files of an HF directory that change tokenization, prompts or generation (hashed whole).
HF_TEXT_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.json",
    "vocab.txt",
    "merges.txt",
    "tokenizer.model",
    "spiece.model",
    "chat_template.jinja",
    "chat_template.json",
    "model.safetensors.index.json",
)
PICKLED = (".bin", ".pt", ".pth", ".ckpt")


class ModelNotFoundError(ValueError):
    """The model argument names nothing the engine can load; the message says what to do."""


@dataclass(frozen=True)
class ModelLocation:
    """What a model argument points at. ``path``: the HF directory or the GGUF file; for a preset,
    None (it is materialized only when loaded)."""

    argument: str
    kind: Literal["hf", "gguf", "preset"]
    path: Path | None = None
    preset: str | None = None


def locate_model(model: str | Path) -> ModelLocation:
    """Resolve ``model`` without loading it. Raises ``ModelNotFoundError`` naming what is accepted."""
    from prefixflow.engine.gguf.files import find_gguf_file
    from prefixflow.engine.loading import embedded, presets

    text = str(model)
    path = Path(text).expanduser()
    if path.is_file():
        if path.suffix.lower() == ".gguf":
            return ModelLocation(text, "gguf", path)
        raise ModelNotFoundError(
            f"model file {text!r} is not a .gguf file; pass a .gguf file or a model directory"
        )
    if path.is_dir():
        if (path / "config.json").is_file():
            safetensors_files(path)  # fails fast on pickled-only or incomplete checkpoints
            return ModelLocation(text, "hf", path)
        if any(c.suffix.lower() == ".gguf" for c in path.iterdir() if c.is_file()):
            try:
                return ModelLocation(text, "gguf", find_gguf_file(path))
            except (FileNotFoundError, ValueError) as exc:
                raise ModelNotFoundError(str(exc)) from None
        raise ModelNotFoundError(f"{path} has neither config.json (Hugging Face) nor a .gguf file")
    if text in embedded.EMBEDDED_MODELS:
        try:
            gguf = embedded.resolve_embedded(text)
        except embedded.EmbeddedModelMissing as exc:
            raise ModelNotFoundError(str(exc)) from None
        assert gguf is not None
        return ModelLocation(text, "gguf", gguf)
    if text in presets.available_presets():
        return ModelLocation(text, "preset", preset=text)
    raise ModelNotFoundError(
        f"model {text!r} is not a directory, a .gguf file, a preset ({', '.join(presets.available_presets())}) "
        f"or an embedded model ({', '.join(embedded.EMBEDDED_MODELS)})"
    )


def safetensors_files(path: Path) -> list[Path]:
    """The weight files an HF directory loads from; a clear error when there are none to load."""
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [path / name for name in sorted(set(weight_map.values()))]
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise ModelNotFoundError(f"{index} names weight files that are missing: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickles = sorted(p.name for p in path.iterdir() if p.suffix in PICKLED)
    if pickles:
        raise ModelNotFoundError(
            f"{path} holds only pickled weights ({', '.join(pickles)}): pickled checkpoints are never loaded "
            "(unpickling can run code); prefixflow loads safetensors or GGUF. Convert once with transformers: "
            'python -c "import sys; from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; '
            'src, dst = sys.argv[1:]; M.from_pretrained(src).save_pretrained(dst); T.from_pretrained(src).save_pretrained(dst)" '
            f"{path} {path}-safetensors   (or to GGUF with llama.cpp's convert_hf_to_gguf.py)"
        )
    raise ModelNotFoundError(f"no *.safetensors weights in {path} (safetensors or a .gguf file is needed)")


def resolve_dtype(dtype: str = "auto", device: str = "auto", location: ModelLocation | None = None) -> str:
    """The dtype ``EngineConfig(dtype, device)`` runs ``location`` in. ``auto``: bf16 on CUDA; on the CPU
    bf16 for a GGUF file of Q8_0/Q4_0/Q4_1 blocks where the CPU multiplies bf16 natively (its weights
    are already 4-8-bit, and bf16 ran 1.5-2x float32 there: quantization/weight_path.py), else float32."""
    import torch

    if dtype != "auto":
        return dtype
    if device == "cuda" or (device == "auto" and torch.cuda.is_available()):
        return "bfloat16"
    from prefixflow.engine.quantization.weight_path import cpu_auto_dtype

    return cpu_auto_dtype(location.path if location is not None and location.kind == "gguf" else None)


def describe_model(
    model: str,
    dtype: str = "auto",
    device: str = "auto",
    quantization: str | None = None,
    sparsity: str | None = None,
    cpu_int8: str = "auto",
) -> dict[str, Any]:
    """Identity of ``model`` plus the dtype and quantization it would run with, without loading weights
    (see module doc). ``cpu_int8``: ``EngineConfig.cpu_int8`` (whether CPU matmuls run in int8).

    Returns a plain JSON-able dict (keys in docs/contracts.md). Raises ``ModelNotFoundError`` (a
    ValueError whose message says what is accepted or what to do) for a model that cannot load, and
    ``QuantizationError`` (a ValueError naming the field) for a quantization it cannot run.
    """
    location = locate_model(model)
    return identity_of(
        location,
        resolve_dtype(dtype, device, location),
        quantization,
        sparsity,
        resolve_device(device),
        cpu_int8,
    )


def resolve_device(device: str = "auto") -> str:
    import torch

    return ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device


def identity_of(
    location: ModelLocation,
    dtype: str,
    quantization: str | None = None,
    sparsity: str | None = None,
    device: str = "cpu",
    cpu_int8: str = "auto",
) -> dict[str, Any]:
    """``quantization`` is the method's settings (part of the digest: it decides outputs), with the
    2:4 kernel ``device`` would run; ``weight_bytes`` what the weights take in that dtype and method,
    and for a GGUF file ``weight_path`` (packed or dense on ``device``, and why): informational, not
    digested. ``linear_kernel``: the CPU matmul and why (informational); where it is int8 (w8a8),
    ``w8a8`` names the scheme and is digested (it changes outputs)."""
    out: dict[str, Any] = {"model": location.argument, "format": location.kind, "dtype": dtype}
    if location.kind == "hf":
        assert location.path is not None
        out["weights"] = {f.name: file_digest(f) for f in safetensors_files(location.path)}
        out["files"] = _text_files(location.path)
    elif location.kind == "gguf":
        assert location.path is not None
        out["file"] = location.path.name
        out.update(gguf_digests(location.path))
    else:
        assert location.preset is not None
        out.update(_preset_digests(location.preset))
    out.update(_weights(location, dtype, quantization, sparsity, device, cpu_int8))
    _add_sparse_kernel(out, device, dtype)
    out.update(_linear_kernel(device, dtype, cpu_int8, out))
    out["digest"] = _digest(
        {k: v for k, v in out.items() if k not in ("model", "weight_bytes", "weight_path", "linear_kernel")}
    )
    return out


def memory_identity(
    name: str,
    identity: dict[str, Any],
    dtype: str,
    hf_config: dict[str, Any] | None = None,
    quantization: str | None = None,
    sparsity: str | None = None,
    device: str = "cpu",
    cpu_int8: str = "auto",
) -> dict[str, Any]:
    """An in-memory ``ModelSource`` names itself (its ``identity``); dtype and quantization are added as for files."""
    out: dict[str, Any] = {"model": name, "format": "memory", "dtype": dtype, **identity}
    if hf_config is not None:
        from prefixflow.engine.quantization.footprint import describe_weights

        out.update(describe_weights(hf_config, dtype, quantization, sparsity))
        _add_sparse_kernel(out, device, dtype)
    if cpu_int8 == "on" and device == "cpu":
        out.update(_linear_kernel(device, dtype, cpu_int8, out))
    out["digest"] = _digest(
        {k: v for k, v in out.items() if k not in ("model", "weight_bytes", "linear_kernel")}
    )
    return out


def _add_sparse_kernel(out: dict[str, Any], device: str, dtype: str) -> None:
    """The 2:4 kernel this device runs (quantization/sparse24.py ``sparse_kernel``), beside the sparsity."""
    sparsity = out.get("quantization", {}).get("sparsity")
    if sparsity is None:
        return
    import torch

    from prefixflow.engine.dtypes import torch_dtype
    from prefixflow.engine.quantization.sparse24 import sparse_kernel

    quantized = out["quantization"].get("method") not in ("none", "gguf")
    sparsity["kernel"], sparsity["kernel_why"] = sparse_kernel(
        torch.device(device), torch_dtype(dtype), quantized
    )


def _weights(
    location: ModelLocation,
    dtype: str,
    quantization: str | None,
    sparsity: str | None = None,
    device: str = "cpu",
    cpu_int8: str = "auto",
) -> dict[str, Any]:
    """``quantization`` and ``weight_bytes`` from the shapes alone (engine/quantization/footprint.py)."""
    from prefixflow.engine.loading import presets
    from prefixflow.engine.quantization.footprint import describe_gguf_weights, describe_weights

    if location.kind == "gguf":
        assert location.path is not None
        return describe_gguf_weights(location.path, dtype, quantization, sparsity, device, cpu_int8)
    if location.kind == "hf":
        assert location.path is not None
        config = json.loads((location.path / "config.json").read_text())
    else:
        assert location.preset is not None
        config = presets.hf_config_of(presets.load_preset(location.preset))
    return describe_weights(config, dtype, quantization, sparsity)


def file_digest(path: Path, start: int = 0) -> str:
    """Size plus the first and last MiB after ``start``: cheap, and changes whenever a file is replaced."""
    size = path.stat().st_size
    h = hashlib.sha256(str(size).encode())
    with open(path, "rb") as f:
        f.seek(start)
        h.update(f.read(SPAN))
        if size - start > SPAN:
            f.seek(max(start + SPAN, size - SPAN))
            h.update(f.read(SPAN))
    return h.hexdigest()[:16]


def _whole(path: Path, end: int | None = None) -> str:
    with open(path, "rb") as f:
        data = f.read() if end is None else f.read(end)
    return hashlib.sha256(data).hexdigest()[:16]


def _text_files(path: Path) -> dict[str, str]:
    names = [n for n in HF_TEXT_FILES if (path / n).is_file()]
    extra = path / "additional_chat_templates"
    found = {n: _whole(path / n) for n in names}
    if extra.is_dir():
        found.update({f"{extra.name}/{f.name}": _whole(f) for f in sorted(extra.iterdir()) if f.is_file()})
    return found


def gguf_digests(path: Path) -> dict[str, Any]:
    """``header``: the whole header hashed; ``weights``: size plus first and last MiB of the tensor data."""
    from prefixflow.engine.gguf.header import GGUFHeaderError, gguf_header_size

    try:
        header = gguf_header_size(path)
    except GGUFHeaderError as exc:
        raise ModelNotFoundError(f"{path}: {exc}") from None
    return {"header": _whole(path, header), "weights": {path.name: file_digest(path, start=header)}}


def _preset_digests(name: str) -> dict[str, Any]:
    """A preset is random weights made from its JSON (shapes, seed) and a tokenizer trained on the
    shipped corpus: those two files decide it."""
    from prefixflow.engine.loading import presets, tokenizer_train

    blob = json.dumps(presets.load_preset(name), sort_keys=True).encode()
    return {
        "preset": name,
        "weights": {f"{name}.json": hashlib.sha256(blob).hexdigest()[:16]},
        "files": {"tokenizer corpus": _whole(tokenizer_train.CORPUS)},
    }


def _digest(value: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:16]


def _linear_kernel(device: str, dtype: str, cpu_int8: str, out: dict[str, Any]) -> dict[str, Any]:
    """The dense CPU matmul and why. int8 (w8a8, engine/quantization/int8_path.py) adds the digested
    ``w8a8``; oneDNN-prepacked bf16 or torch's F.linear are not digested (the same math up to the
    summation order; kernels/cpu_linear.py)."""
    from prefixflow.engine.quantization.int8_path import choose_cpu_int8
    from prefixflow.kernels.cpu_linear import linear_kernel

    chosen = linear_kernel(device, dtype)
    if chosen is None:
        return {}
    method = out.get("quantization", {}).get("method")
    int8 = choose_cpu_int8(cpu_int8, device, dtype, out.get("weight_path"), method)
    if int8.int8:
        return {"linear_kernel": int8.linear_kernel(), "w8a8": int8.digest_entry()}
    described = chosen.describe()
    return {"linear_kernel": {**described, "reason": f"{described['reason']}; int8: {int8.reason}"}}
