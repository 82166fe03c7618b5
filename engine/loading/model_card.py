"""A model as far as it can be known without its weights or torch: shape, tokenizer, chat template, and
how the checkpoint stores its weights.

The workload advisor (``prefixflow plan --advise``) renders and counts prompts with the real tokenizer
and template and sizes memory from the real config, on a machine that may not have torch or a GPU;
so nothing here imports torch or reads a weight tensor.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefixflow.engine.loading.model_identity import ModelNotFoundError

__all__ = ["ModelCard", "ModelNotFoundError", "hf_precision", "inspect_model"]


@dataclass(frozen=True)
class ModelCard:
    """``hf_config`` is shaped like a Hugging Face config.json; ``checkpoint_bytes`` is the weights' size
    on disk (None for a random-init preset); ``checkpoint_precision`` names how they are stored."""

    name: str
    format: str  # "hf" | "gguf" | "preset"
    hf_config: dict[str, Any]
    tokenizer: Any  # a transformers PreTrainedTokenizerBase
    chat_template: str | None
    checkpoint_bytes: int | None
    checkpoint_precision: str

    @property
    def vocab_size(self) -> int:
        """The model's vocabulary (what the pipeline checks sampling values against, as with a loaded LLM)."""
        return int(self.hf_config["vocab_size"])

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        """The same rendering ``LLM.apply_chat_template`` does, without loading the model."""
        template = getattr(self.tokenizer, "chat_template", None) or self.chat_template
        if not template:
            raise ValueError(f"model {self.name!r} has no chat template")
        return str(
            self.tokenizer.apply_chat_template(
                messages, tokenize=False, add_generation_prompt=add_generation_prompt, chat_template=template
            )
        )


def inspect_model(model: str) -> ModelCard:
    """Config and tokenizer of ``model`` (HF directory, GGUF file, embedded model or preset), no weights.

    Resolved by ``locate_model`` like loading is, so it raises the same ``ModelNotFoundError`` (a
    ValueError naming what is accepted). A preset's tokenizer is the one the engine trains for it
    (deterministic), so no random weights are built.
    """
    from prefixflow.engine.loading.model_identity import locate_model

    location = locate_model(model)
    if location.kind == "hf":
        assert location.path is not None
        return _hf_dir(location.path)
    if location.kind == "gguf":
        assert location.path is not None
        return _gguf(location.path)
    assert location.preset is not None
    return _preset(location.preset)


def _hf_dir(path: Path) -> ModelCard:
    from transformers import AutoTokenizer

    cfg = json.loads((path / "config.json").read_text())
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    files = sorted(path.glob("*.safetensors"))
    return ModelCard(
        name=path.name,
        format="hf",
        hf_config=cfg,
        tokenizer=tokenizer,
        chat_template=getattr(tokenizer, "chat_template", None),
        checkpoint_bytes=sum(f.stat().st_size for f in files) or None,
        checkpoint_precision=hf_precision(cfg),
    )


def hf_precision(cfg: dict[str, Any]) -> str:
    """``gptq-int4``, ``awq-int4``, ``compressed-tensors``, ``fp8`` ... from ``quantization_config``;
    otherwise the stored dtype (``torch_dtype`` / ``dtype``)."""
    quant = cfg.get("quantization_config")
    if isinstance(quant, dict):
        method = str(quant.get("quant_method") or "quantized")
        bits = quant.get("bits") or quant.get("w_bit")
        return f"{method}-int{bits}" if bits else method
    return str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32")


def _gguf(path: Path) -> ModelCard:
    """Parsing a GGUF file's metadata takes seconds (its vocabulary is thousands of small fields), so the
    card is cached beside the tokenizer the engine caches, under the same content key."""
    from prefixflow.engine.gguf.tokenizer import cached_tokenizer
    from prefixflow.engine.loading.model_identity import gguf_digests

    file = path
    digests = gguf_digests(file)
    key = f"{digests['header']}/{digests['weights'][file.name]}"  # the loader's tokenizer cache key
    card_file = _gguf_card_dir() / f"{hashlib.sha256(key.encode()).hexdigest()[:32]}.json"
    tokenizer: Any = cached_tokenizer(key)
    if tokenizer is not None and card_file.is_file():
        saved = json.loads(card_file.read_text())
        if saved.get("chat_template") is not None:
            tokenizer.chat_template = saved["chat_template"]
    else:
        saved, tokenizer = _read_gguf(file, key)
        _save_json(card_file, saved)
    return ModelCard(
        name=file.stem,
        format="gguf",
        hf_config=saved["hf_config"],
        tokenizer=tokenizer,
        chat_template=saved["chat_template"],
        checkpoint_bytes=file.stat().st_size,
        checkpoint_precision=saved["precision"],
    )


def _read_gguf(file: Path, key: str) -> tuple[dict[str, Any], Any]:
    from gguf import LlamaFileType

    from prefixflow.engine.gguf.metadata import build_hf_config, field_value
    from prefixflow.engine.gguf.reader import GGUFFile
    from prefixflow.engine.gguf.tokenizer import build_tokenizer, chat_template

    reader = GGUFFile(file)
    template = chat_template(reader)
    kind = field_value(reader, "general.file_type", None)
    try:
        precision = (
            "gguf-" + LlamaFileType(int(kind)).name.removeprefix("MOSTLY_") if kind is not None else "gguf"
        )
    except ValueError:
        precision = f"gguf-type{kind}"
    card = {
        "hf_config": build_hf_config(reader, "float32"),
        "chat_template": template,
        "precision": precision,
    }
    return card, build_tokenizer(reader, file, template, cache_key=key)


def _gguf_card_dir() -> Path:
    from prefixflow.engine.loading.presets import cache_dir

    return cache_dir() / "gguf-cards"


def _save_json(target: Path, data: dict[str, Any]) -> None:
    """Atomic write; a cache that cannot be written only costs time."""
    import os
    import tempfile

    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, target)
    except OSError:
        pass


def _preset(name: str) -> ModelCard:
    from prefixflow.engine.loading import presets
    from prefixflow.engine.loading.tokenizer_train import train_tokenizer

    cfg = presets.hf_config_of(presets.load_preset(name))
    tokenizer = train_tokenizer(int(cfg["vocab_size"]))
    return ModelCard(
        name=name,
        format="preset",
        hf_config=cfg,
        tokenizer=tokenizer,
        chat_template=getattr(tokenizer, "chat_template", None),
        checkpoint_bytes=None,
        checkpoint_precision=str(cfg.get("torch_dtype") or cfg.get("dtype") or "float32"),
    )
