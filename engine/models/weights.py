"""Map Hugging Face parameter names onto the engine's (merged) modules, load them, and finish loading.

Linear layers take any checkpoint tensor their ``LinearMethod`` declares (``weight``, ``qweight``,
``weight_packed``, ``gguf_q4_1`` ...) and check their own completeness in ``process_after_loading``,
which also repacks quantized weights for the device's kernel. Other tensors are checked here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch

from prefixflow.engine.models.linear import KernelContext, Linear
from prefixflow.engine.models.llama import DecoderLayer, LlamaForCausalLM
from prefixflow.engine.quantization.params import CheckpointError

# checkpoint projection name -> (our merged module, shard index)
_MERGED = {
    "q_proj": ("qkv_proj", 0),
    "k_proj": ("qkv_proj", 1),
    "v_proj": ("qkv_proj", 2),
    "gate_proj": ("gate_up_proj", 0),
    "up_proj": ("gate_up_proj", 1),
}
_LAYER = re.compile(r"^model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)\.(\w+)$")
_IGNORED = re.compile(r"rotary_emb\.inv_freq$")
_OTHER_STAGE = "another pipeline stage's tensor"


def load_weights(
    model: LlamaForCausalLM, weights: Iterable[tuple[str, torch.Tensor]], ctx: KernelContext | None = None
) -> None:
    """Copy every checkpoint tensor into place, then prepare every linear layer for ``ctx``'s kernels
    (default: the model's own device and dtype); fail naming any tensor missing or unexpected."""
    copy_weights(model, weights)
    finish_loading(model, ctx)


def copy_weights(model: LlamaForCausalLM, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Only the copy: checkpoint tensors into their (checkpoint-layout) buffers; other tensors checked."""
    expected = _expected_keys(model)
    loaded: set[str] = set()
    for name, tensor in weights:
        if _IGNORED.search(name):
            continue
        if name.startswith("lm_head.") and model.lm_head is None:
            continue  # tied: some checkpoints store the copy anyway
        key = _load_one(model, name, tensor)
        if key == _OTHER_STAGE:
            continue
        if key is None:
            raise CheckpointError(f"unexpected tensor {name!r} in checkpoint")
        loaded.add(key)
    missing = expected - loaded
    if missing:
        raise CheckpointError(f"checkpoint is missing {len(missing)} tensors, e.g. {sorted(missing)[:3]}")


def finish_loading(model: LlamaForCausalLM, ctx: KernelContext | None = None) -> None:
    """Each linear layer checks it is complete and repacks for the kernel ``ctx`` selects."""
    if ctx is None:
        weight = next(p for p in model.parameters() if p.is_floating_point())
        ctx = KernelContext(weight.device, weight.dtype)
    for module in model.modules():
        if isinstance(module, Linear):
            module.process_after_loading(ctx)


def _load_one(model: LlamaForCausalLM, name: str, tensor: torch.Tensor) -> str | None:
    m = _LAYER.match(name)
    if m:
        idx, block, proj, param = int(m.group(1)), m.group(2), m.group(3), m.group(4)
        if (idx := _local(model, idx)) < 0:
            return _OTHER_STAGE
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
        if model.embed_tokens is None:
            return _OTHER_STAGE
        model.embed_tokens.load(tensor, name)  # this rank's vocabulary rows
        return name
    if name == "model.norm.weight":
        if model.norm is None:
            return _OTHER_STAGE
        _copy(model.norm.weight, tensor, name)
        return name
    lm = re.match(r"^model\.layers\.(\d+)\.(input_layernorm|post_attention_layernorm)\.weight$", name)
    if lm:
        if (idx := _local(model, int(lm.group(1)))) < 0:
            return _OTHER_STAGE
        if idx >= len(model.layers):
            return None
        _copy(getattr(model.layers[idx], lm.group(2)).weight, tensor, name)
        return name
    if name.startswith("lm_head.") and model.lm_head is not None:
        model.lm_head.load(name.split(".")[-1], tensor)
        return name
    if name.startswith("lm_head.") and model.pp is not None and not model.pp.is_last:
        return _OTHER_STAGE
    return None


def _local(model: LlamaForCausalLM, idx: int) -> int:
    """Index into ``model.layers`` of checkpoint layer ``idx``; -1 for another pipeline stage's layer."""
    local = idx - model.first_layer
    if model.pp is not None and not 0 <= local < model.pp.num_layers:
        return -1
    return local


def _copy(param: torch.Tensor, tensor: torch.Tensor, name: str) -> None:
    if param.shape != tensor.shape:
        raise CheckpointError(
            f"{name}: checkpoint shape {tuple(tensor.shape)} != model shape {tuple(param.shape)}"
        )
    param.data.copy_(tensor)


def _expected_keys(model: LlamaForCausalLM) -> set[str]:
    """Tensors outside linear layers (those check their own, per method, after loading)."""
    keys = {"model.embed_tokens.weight"} if model.embed_tokens is not None else set()
    keys |= {"model.norm.weight"} if model.norm is not None else set()
    for local, layer in enumerate(model.layers):
        i = local + model.first_layer
        assert isinstance(layer, DecoderLayer)
        if layer.self_attn.q_norm is not None:
            keys |= {
                f"{local}.self_attn.q_norm.weight",
                f"{local}.self_attn.k_norm.weight",
            }  # as _load_one keys them
        keys |= {f"model.layers.{i}.{n}.weight" for n in ("input_layernorm", "post_attention_layernorm")}
    return keys
