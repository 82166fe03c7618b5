"""Targets for the draft-model tests: the tiny preset grown by a layer (so tiny is a good draft: same
tokenizer, close predictions, fewer parameters), and a model with another vocabulary."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

from prefixflow.engine.loading.presets import hf_config_of, load_preset, materialize, save_random_model


def grown_tiny(root: Path, scale: float = 0.3) -> Path:
    """tiny + a third layer (a copy of its last, with the residual writes scaled by ``scale``)."""
    out = root / f"tiny-grown-{scale}"
    if (out / "config.json").exists():
        return out
    src = materialize("tiny")
    out.mkdir(parents=True)
    for f in src.iterdir():
        if f.name not in ("config.json", "model.safetensors"):
            shutil.copy(f, out / f.name)
    cfg = json.loads((src / "config.json").read_text())
    last = cfg["num_hidden_layers"] - 1
    cfg["num_hidden_layers"] += 1
    weights = load_file(str(src / "model.safetensors"))
    for name, tensor in list(weights.items()):
        prefix = f"model.layers.{last}."
        if name.startswith(prefix):
            new = tensor.clone()
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                new *= scale
            weights[f"model.layers.{last + 1}." + name[len(prefix) :]] = new
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(cfg))
    return out


def other_vocabulary(root: Path) -> Path:
    out = root / "tiny-vocab-384"
    if not (out / "config.json").exists():
        cfg = hf_config_of(load_preset("tiny"))
        cfg["vocab_size"] = 384
        save_random_model(cfg, out)
    return out


def larger(root: Path) -> Path:
    out = root / "tiny-wide"
    if not (out / "config.json").exists():
        cfg = hf_config_of(load_preset("tiny"))
        cfg.update(hidden_size=128, intermediate_size=256, num_hidden_layers=3)
        save_random_model(cfg, out)
    return out
