"""Model hyperparameters read from a Hugging Face style config dict, for every supported architecture."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SUPPORTED_ARCHITECTURES: dict[str, str] = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
}


class UnsupportedModelError(ValueError):
    """The checkpoint's architecture is not one this engine implements."""


@dataclass(frozen=True)
class ModelConfig:
    """The shape of a Llama-family decoder; one class covers Llama 2/3/3.1, Mistral, Qwen2 and Qwen3."""

    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict[str, Any] | None
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    qk_norm: bool
    sliding_window: int | None

    @property
    def kv_bytes_per_token(self) -> int:
        """Bytes per token per element size unit (multiply by dtype size)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim

    @classmethod
    def from_hf(cls, cfg: dict[str, Any]) -> ModelConfig:
        archs = cfg.get("architectures") or []
        arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
        if arch is None:
            raise UnsupportedModelError(
                f"unsupported architecture {archs or cfg.get('model_type')!r}; "
                f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        family = SUPPORTED_ARCHITECTURES[arch]
        heads = int(cfg["num_attention_heads"])
        hidden = int(cfg["hidden_size"])
        rope = dict(cfg.get("rope_parameters") or {})
        theta = float(rope.pop("rope_theta", cfg.get("rope_theta", 10000.0)))
        scaling = cfg.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        if scaling is not None:
            scaling = dict(scaling)
            kind = scaling.get("rope_type", scaling.get("type", "default"))
            if kind not in ("default", "llama3", "linear"):
                raise UnsupportedModelError(
                    f"unsupported rope_scaling type {kind!r}; supported: llama3, linear"
                )
            scaling = None if kind == "default" else {**scaling, "rope_type": kind}
        sliding = cfg.get("sliding_window") if family in ("mistral", "qwen2", "qwen3") else None
        if family in ("qwen2", "qwen3") and not cfg.get("use_sliding_window", False):
            sliding = None
        return cls(
            architecture=arch,
            family=family,
            vocab_size=int(cfg["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or hidden // heads),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            max_position_embeddings=int(cfg.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            attention_bias=bool(cfg.get("attention_bias", family == "qwen2")),
            qk_norm=family == "qwen3",
            sliding_window=int(sliding) if sliding else None,
        )
