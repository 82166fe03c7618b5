"""GGUF metadata → a Hugging Face ``LlamaConfig``-shaped dict, so the engine sees one config format."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from prefixflow.engine.gguf.reader import GGUFFile

if TYPE_CHECKING:  # torch-free at run time: the advisor reads GGUF metadata without loading torch
    import torch

SUPPORTED_ARCHITECTURES = ("llama",)

_MISSING = object()


def field_value(reader: GGUFFile, key: str, default: Any = _MISSING) -> Any:
    """One metadata value as a plain Python value (str, int, float, bool or list)."""
    field = reader.fields.get(key)
    if field is None:
        if default is _MISSING:
            raise ValueError(f"GGUF file lacks required metadata key {key!r}")
        return default
    return field.value()


def architecture(reader: GGUFFile) -> str:
    """The ``general.architecture`` key; anything but ``llama`` is refused here, before any tensor is read."""
    arch = field_value(reader, "general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(
            f"unsupported GGUF architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)} "
            "(Llama, Mistral, SmolLM-style models)"
        )
    return str(arch)


def build_hf_config(reader: GGUFFile, dtype: torch.dtype | str) -> dict[str, Any]:
    """Map the ``llama.*`` hyperparameters and tokenizer ids onto HF ``config.json`` field names."""
    arch = architecture(reader)

    def get(key: str, default: Any = _MISSING) -> Any:
        return field_value(reader, f"{arch}.{key}", default)

    if get("expert_count", 0):
        raise ValueError(
            f"GGUF {arch!r} model with {get('expert_count')} experts (mixture of experts) is not supported; "
            "only dense Llama-style models load"
        )
    tensor_names = {t.name for t in reader.tensors}
    hidden = int(get("embedding_length"))
    heads = int(get("attention.head_count"))
    head_dim = int(get("attention.key_length", hidden // heads))
    rope_dim = int(get("rope.dimension_count", head_dim))
    if rope_dim != head_dim:
        raise ValueError(
            f"GGUF rotary dimension {rope_dim} != head dimension {head_dim} (partial rotary) is not supported"
        )
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    embed = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
    vocab = get("vocab_size", None) or (tokens.count if tokens is not None else None)
    if vocab is None and embed is not None:
        vocab = int(embed.shape[-1])
    if vocab is None:
        raise ValueError(
            "GGUF file has no vocabulary size, no tokenizer.ggml.tokens and no token_embd.weight"
        )
    cfg: dict[str, Any] = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": int(get("feed_forward_length")),
        "num_hidden_layers": int(get("block_count")),
        "num_attention_heads": heads,
        "num_key_value_heads": int(get("attention.head_count_kv", heads)),
        "head_dim": head_dim,
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon", 1e-5)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),
        "max_position_embeddings": int(get("context_length", 4096)),
        "vocab_size": int(vocab),
        "tie_word_embeddings": "output.weight" not in tensor_names,
        "attention_bias": "blk.0.attn_q.bias" in tensor_names,
        "mlp_bias": False,
        "hidden_act": "silu",
        "torch_dtype": str(dtype).removeprefix("torch."),
    }
    rope_scaling = _rope_scaling(reader, arch, head_dim, cfg["rope_theta"])
    if rope_scaling is not None:
        cfg["rope_scaling"] = rope_scaling
    window = get("attention.sliding_window", None)
    if window:
        cfg["sliding_window"] = int(window)
    for hf_key, gguf_key in (
        ("bos_token_id", "bos_token_id"),
        ("eos_token_id", "eos_token_id"),
        ("pad_token_id", "padding_token_id"),
    ):
        value = field_value(reader, f"tokenizer.ggml.{gguf_key}", None)
        if value is not None:
            cfg[hf_key] = int(value)
    return cfg


def _rope_scaling(reader: GGUFFile, arch: str, head_dim: int, theta: float) -> dict[str, Any] | None:
    """HF ``rope_scaling`` from the ``rope.scaling.*`` keys, or from a Llama-3 ``rope_freqs`` tensor.

    llama.cpp stores Llama 3.1+ frequency scaling as per-frequency divisors, not as parameters; the
    HF ``llama3`` parameters that reproduce those divisors are recovered here (or the load fails).
    """
    kind = field_value(reader, f"{arch}.rope.scaling.type", None)
    factor = field_value(reader, f"{arch}.rope.scaling.factor", None)
    if factor is None and field_value(reader, f"{arch}.rope.scale_linear", None) is not None:
        kind, factor = "linear", field_value(reader, f"{arch}.rope.scale_linear")
    if kind and kind != "none" and factor is not None and float(factor) != 1.0:
        scaling: dict[str, Any] = {"rope_type": kind, "factor": float(factor)}
        original = field_value(reader, f"{arch}.rope.scaling.original_context_length", None)
        if original:
            scaling["original_max_position_embeddings"] = int(original)
        return scaling
    freqs = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if freqs is None:
        return None
    divisors = np.asarray(freqs.data, dtype=np.float64).reshape(-1)
    return _fit_llama3_scaling(divisors, head_dim, theta)


def _llama3_divisors(
    inv_freq: np.ndarray, factor: float, low: float, high: float, original: int
) -> np.ndarray:
    """The per-frequency divisors HF's ``llama3`` rope type applies (inverse of its frequency scaling)."""
    wavelen = 2 * math.pi / inv_freq
    smooth = np.clip((original / wavelen - low) / (high - low), 0.0, 1.0)
    return 1.0 / ((1.0 - smooth) / factor + smooth)


def _fit_llama3_scaling(divisors: np.ndarray, head_dim: int, theta: float) -> dict[str, Any] | None:
    if np.allclose(divisors, 1.0):
        return None
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    factor = float(divisors.max())
    for original in (8192, 4096, 16384, 32768, 2048):
        for low, high in ((1.0, 4.0), (1.0, 2.0), (1.0, 8.0), (2.0, 4.0)):
            if len(inv_freq) == len(divisors) and np.allclose(
                _llama3_divisors(inv_freq, factor, low, high, original), divisors, rtol=1e-3
            ):
                return {
                    "rope_type": "llama3",
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": original,
                }
    raise ValueError("GGUF rope_freqs tensor does not match any Llama-3 rope scaling this loader recognises")
