"""Tiny random Llama / Qwen2 bases for the quantized-checkpoint tests, and their references.

Inputs of 256 and 320 features: groups of 32 and 128 both give several groups per column, and 320
leaves a partial last group of 128 (GPTQ and compressed-tensors allow it).
"""

from __future__ import annotations

from pathlib import Path

import torch

from prefixflow import kernels
from prefixflow.engine.loading.loader import resolve_model
from prefixflow.engine.loading.model_config import ModelConfig
from prefixflow.engine.loading.presets import save_random_model
from prefixflow.engine.models.linear import Linear
from prefixflow.engine.models.llama import LlamaForCausalLM
from prefixflow.engine.models.weights import copy_weights
from prefixflow.engine.quantization import KernelMethod, resolve_quantization
from prefixflow.engine.runner.attention import make_attention_backend
from prefixflow.kernels.fp8_linear import Fp8Weight, quantize_fp8_rows
from prefixflow.kernels.quant_weight import dequantize
from tests.engine.hf_models import ARCHITECTURES, _spread_biases

BASES = {
    "llama": dict(ARCHITECTURES["llama-gqa-llama3rope"], hidden_size=256, intermediate_size=320),
    "qwen2": dict(ARCHITECTURES["qwen2-bias-tied"], hidden_size=256, intermediate_size=320),
}


def make_base(root: Path, name: str) -> Path:
    out = root / f"base-{name}"
    if not (out / "config.json").exists():
        save_random_model(BASES[name], out, seed=3)
        _spread_biases(out)
    return out


def unpacked_weights(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every quantized projection as the engine's unpacker reads it (float32, before kernel repacking),
    split back into checkpoint names (``...q_proj.weight``)."""
    source = resolve_model(model_dir)
    cfg = ModelConfig.from_hf(source.hf_config)
    ops = kernels.select("torch", torch.device("cpu"))
    quant = resolve_quantization(source.hf_config)
    model = LlamaForCausalLM(cfg, torch.float32, ops, make_attention_backend(ops), quant=quant)
    copy_weights(model, source.weights())
    out = {}
    for module in model.modules():
        if not isinstance(module, Linear) or not isinstance(module.method, KernelMethod):
            continue
        module.method.check_complete()
        w = module.method.build(module)
        dense = w.weight.float() * w.scale[:, None] if isinstance(w, Fp8Weight) else dequantize(w)
        for prefix, part in zip(module.prefixes, dense.split(module.out_sizes)):
            out[f"{prefix}.weight"] = part
    return out


def _fp8_round_trip(module: torch.nn.Module, args: tuple) -> tuple:
    """What W8A8 does to a linear layer's input: each token rounded to e4m3 at its own scale."""
    (x,) = args
    xq, scale = quantize_fp8_rows(x.reshape(-1, x.shape[-1]))
    return ((xq.float() * scale).reshape(x.shape).to(x.dtype),)


def hf_twin_greedy(
    twin_dir: Path, prompts: list[list[int]], max_new_tokens: int, fp8_activations: bool = False
) -> list[list[int]]:
    """transformers on the dense twin (float32); with ``fp8_activations`` every projection's input is
    rounded per token to e4m3 first, as the engine's W8A8 layers do."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(twin_dir), dtype=torch.float32).eval()
    if fp8_activations:
        for name, module in model.named_modules():
            if isinstance(module, torch.nn.Linear) and name.rsplit(".", 1)[-1].endswith("_proj"):
                module.register_forward_pre_hook(_fp8_round_trip)
    outs = []
    with torch.inference_mode():
        for ids in prompts:
            x = torch.tensor([ids])
            y = model.generate(
                x,
                attention_mask=torch.ones_like(x),
                max_new_tokens=max_new_tokens,
                min_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            outs.append(y[0, len(ids) :].tolist())
    return outs
