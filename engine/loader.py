"""Turn the ``model`` argument into a ``ModelSource``: HF directory, GGUF file, preset or embedded model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from prefixflow.engine.model_card import ModelNotFoundError
from prefixflow.engine.model_source import ModelSource

__all__ = ["ModelNotFoundError", "load_hf_dir", "resolve_model"]


def resolve_model(model: str | Path | ModelSource) -> ModelSource:
    """Dispatch on what ``model`` is; every failure names what was tried and what is accepted."""
    if isinstance(model, ModelSource):
        return model
    text = str(model)
    path = Path(text).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return _gguf(path)
    if path.is_dir():
        if (path / "config.json").exists():
            return load_hf_dir(path)
        if any(path.glob("*.gguf")):
            return _gguf(path)
        raise ModelNotFoundError(f"{path} has neither config.json (Hugging Face) nor a .gguf file")
    from prefixflow.engine import embedded, presets

    if text in embedded.EMBEDDED_MODELS:
        return _gguf(embedded.resolve_embedded(text))
    if text in presets.available_presets():
        return load_hf_dir(presets.materialize(text))
    raise ModelNotFoundError(
        f"model {text!r} is not a directory, a .gguf file, a preset ({', '.join(presets.available_presets())}) "
        f"or an embedded model ({', '.join(embedded.EMBEDDED_MODELS)})"
    )


def _gguf(path: Path) -> ModelSource:
    from prefixflow.engine.gguf_loader import load_gguf_source

    return load_gguf_source(path)


def load_hf_dir(path: Path) -> ModelSource:
    """Read config, safetensors (single or sharded), tokenizer and EOS ids. Never unpickles anything."""
    from transformers import AutoTokenizer

    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    files = _safetensors_files(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    eos = _eos_ids(path, cfg, tokenizer)

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import safe_open

        for f in files:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)

    size = sum(f.stat().st_size for f in files)
    return ModelSource(
        name=path.name,
        hf_config=cfg,
        weights=weights,
        tokenizer=tokenizer,
        eos_token_ids=eos,
        chat_template=getattr(tokenizer, "chat_template", None),
        identity={"path": str(path.resolve()), "format": "hf", "bytes": size},
    )


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        weight_map = json.loads(index.read_text())["weight_map"]
        return [path / name for name in sorted(set(weight_map.values()))]
    files = sorted(path.glob("*.safetensors"))
    if files:
        return files
    pickles = [p.name for p in path.iterdir() if p.suffix in (".bin", ".pt", ".pth", ".ckpt")]
    hint = (
        f" (found {', '.join(pickles)}: pickled checkpoints are never loaded; convert to safetensors)"
        if pickles
        else ""
    )
    raise ModelNotFoundError(f"no *.safetensors weights in {path}{hint}")


def _eos_ids(path: Path, cfg: dict, tokenizer) -> tuple[int, ...]:
    ids: list[int] = []
    gen = path / "generation_config.json"
    sources = [json.loads(gen.read_text()).get("eos_token_id")] if gen.exists() else []
    sources += [cfg.get("eos_token_id"), getattr(tokenizer, "eos_token_id", None)]
    for value in sources:
        for i in value if isinstance(value, list) else [value]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)
