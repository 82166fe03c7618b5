"""Map Hugging Face parameter names onto the engine's (merged) modules and load them."""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import cast

import torch

from prefixflow.engine.models.linear import Linear
from prefixflow.engine.models.llama import DecoderLayer, LlamaForCausalLM

# checkpoint projection name -> (our merged module, shard index)
_MERGED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.(weight|bias)$")
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")


def load_weights(model: LlamaForCausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Copy every checkpoint tensor into place; fail naming any tensor missing or unexpected."""
    expected = _expected_keys(model)
    loaded: set[str] = set()
    for name, tensor in weights:
        if _IGNORED.search(name):
            continue
        if name == "lm_head.weight" and model.lm_head is None:
            continue  # tied: some checkpoints store the copy anyway
        key = _load_one(model, name, tensor)
        if key is None:
            raise ValueError(f"unexpected tensor {name!r} in checkpoint")
        loaded.add(key)
    missing = expected - loaded
    if missing:
        raise ValueError(f"checkpoint is missing {len(missing)} tensors, e.g. {sorted(missing)[:3]}")


def _load_one(model: LlamaForCausalLM, name: str, tensor: torch.Tensor) -> str | None:
    m = _LAYER.match(name)
    if m:
        idx, block, proj, param = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if idx >= len(model.layers):
            return None
        parent = getattr(model.layers[idx], block)
        target, shard = _MERGED.get(proj, (proj, 0))
        module = getattr(parent, target, None)
        if isinstance(module, Linear):
            module.load(param, tensor, shard)
            return f"{idx}.{block}.{proj}.{param}"
        if module is not None and param == "weight":  # q_norm / k_norm
            _copy(module.weight, tensor, name)
            return f"{idx}.{block}.{proj}.{param}"
        return None
    if name == "model.embed_tokens.weight":
        model.embed_tokens.load(tensor, name)  # this rank's vocabulary rows
        return name
    if name == "model.norm.weight":
        _copy(model.norm.weight, tensor, name)
        return name
    lm = re.match(r"^model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight$", name)
    if lm:
        idx = int(lm.group(1))
        if idx >= len(model.layers):
            return None
        _copy(getattr(model.layers[idx], lm.group(2)).weight, tensor, name)
        return name
    if name.startswith("lm_head.") and model.lm_head is not None:
        model.lm_head.load(name.split(".")[-1], tensor)
        return name
    return None


def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise ValueError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)}"
        )
    param.data.copy_(tensor)


def _expected_keys(model: LlamaForCausalLM) -> set[str]:
    keys = {"model.embed_tokens.weight", "model.norm.weight"}
    for i, layer in enumerate(model.layers):
        attn = cast(DecoderLayer, layer).self_attn
        for proj in ("q_proj", "k_proj", "v_proj"):
            keys.add(f"{i}.self_attn.{proj}.weight")
            if attn.qkv_proj.bias is not None:
                keys.add(f"{i}.self_attn.{proj}.bias")
        keys.add(f"{i}.self_attn.o_proj.weight")
        if attn.o_proj.bias is not None:
            keys.add(f"{i}.self_attn.o_proj.bias")
        if attn.q_norm is not None:
            keys |= {f"{i}.self_attn.q_norm.weight", f"{i}.self_attn.k_norm.weight"}
        keys |= {f"{i}.mlp.{p}.weight" for p in ("gate_proj", "up_proj", "down_proj")}
        keys |= {f"model.layers.{i}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")}
    if model.lm_head is not None:
        keys.add("lm_head.weight")
    return keys
