"""Turn the ``model`` argument into a ``ModelSource``: HF directory, GGUF file, preset or embedded model.

Where the argument points is decided by ``model_identity.locate_model`` (the same resolver
``describe_model`` uses); this module only reads what it found.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import torch

from prefixflow.engine.loading.model_identity import (
    ModelLocation,
    ModelNotFoundError,
    locate_model,
    safetensors_files,
)
from prefixflow.engine.loading.model_source import ModelSource

__all__ = ["ModelNotFoundError", "load_hf_dir", "load_location", "resolve_model"]


def resolve_model(model: str | Path | ModelSource) -> ModelSource:
    """Dispatch on what ``model`` is; every failure names what was tried and what is accepted."""
    if isinstance(model, ModelSource):
        return model
    return load_location(locate_model(model))


def load_location(location: ModelLocation) -> ModelSource:
    if location.kind == "gguf":
        from prefixflow.engine.gguf import load_gguf_source

        assert location.path is not None
        return load_gguf_source(location.path, location=location)
    if location.kind == "preset":
        from prefixflow.engine.loading import presets

        assert location.preset is not None
        return load_hf_dir(presets.materialize(location.preset), location=location)
    assert location.path is not None
    return load_hf_dir(location.path, location=location)


def load_hf_dir(path: Path, location: ModelLocation | None = None) -> ModelSource:
    """Read config, safetensors (single or sharded), tokenizer and EOS ids. Never unpickles anything."""
    from transformers import AutoTokenizer

    path = Path(path)
    cfg = json.loads((path / "config.json").read_text())
    files = safetensors_files(path)
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    eos = _eos_ids(path, cfg, tokenizer)

    def weights() -> Iterator[tuple[str, torch.Tensor]]:
        from safetensors import safe_open

        for f in files:
            with safe_open(str(f), framework="pt") as handle:
                for name in handle.keys():
                    yield name, handle.get_tensor(name)

    return ModelSource(
        name=path.name,
        hf_config=cfg,
        weights=weights,
        tokenizer=tokenizer,
        eos_token_ids=eos,
        chat_template=getattr(tokenizer, "chat_template", None),
        location=location or ModelLocation(str(path), "hf", path),
    )


def _eos_ids(path: Path, cfg: dict[str, object], tokenizer: object) -> tuple[int, ...]:
    ids: list[int] = []
    gen = path / "generation_config.json"
    sources = [json.loads(gen.read_text()).get("eos_token_id")] if gen.exists() else []
    sources += [cfg.get("eos_token_id"), getattr(tokenizer, "eos_token_id", None)]
    for value in sources:
        for i in value if isinstance(value, list) else [value]:
            if isinstance(i, int) and i not in ids:
                ids.append(i)
    return tuple(ids)
