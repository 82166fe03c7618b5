"""Random-initialised models from shape presets in ``configs/models/``, saved as real HF directories.

Why save to disk instead of building in memory: tests and the demo then exercise the same loader
that real checkpoints go through. The directory is cached and keyed by the preset's content hash.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

_REPO_CONFIGS = Path(__file__).resolve().parents[2] / "configs" / "models"


def configs_dir() -> Path:
    return Path(os.environ.get("PREFIXFLOW_MODEL_CONFIGS", _REPO_CONFIGS))


def cache_dir() -> Path:
    return Path(os.environ.get("PREFIXFLOW_CACHE", Path.home() / ".cache" / "prefixflow"))


def available_presets() -> list[str]:
    d = configs_dir()
    return sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []


def load_preset(name: str) -> dict[str, Any]:
    path = configs_dir() / f"{name}.json"
    if not path.exists():
        raise ValueError(f"unknown preset {name!r}; available: {', '.join(available_presets())}")
    preset: dict[str, Any] = json.loads(path.read_text())
    return preset


def hf_config_of(preset: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in preset.items() if k != "prefixflow"}


def materialize(name: str) -> Path:
    """Return an HF model directory for the preset, creating it once (atomically) if needed."""
    preset = load_preset(name)
    digest = hashlib.sha256(json.dumps(preset, sort_keys=True).encode()).hexdigest()[:12]
    target = cache_dir() / "presets" / f"{name}-{digest}"
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        save_random_model(hf_config_of(preset), tmp, seed=preset.get("prefixflow", {}).get("seed", 0))
        try:
            os.rename(tmp, target)
        except OSError:  # another process won the race; its copy is identical
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def save_random_model(hf_config: dict[str, Any], out: Path, seed: int = 0) -> None:
    """Random-init a transformers model from ``hf_config`` and save it with a locally trained tokenizer."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    from prefixflow.engine.loading.tokenizer_train import train_tokenizer

    out = Path(out)
    cfg = dict(hf_config)
    model_type = cfg.pop("model_type")
    config = AutoConfig.for_model(model_type, **cfg)
    tokenizer = train_tokenizer(config.vocab_size)
    eos = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config.eos_token_id = eos
    config.bos_token_id = None
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)  # type: ignore[no-untyped-call]
    model.generation_config = GenerationConfig(  # type: ignore[no-untyped-call]
        eos_token_id=eos, bos_token_id=None, pad_token_id=eos
    )
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
