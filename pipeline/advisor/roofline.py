"""Roofline lower bound for an offline generation job: a model shape, a workload, two machine ceilings.

bound = max(total FLOPs / peak FLOP/s, total bytes / copy bandwidth)   (perfect overlap)

FLOPs: every computed token pays 2 x (decoder matmul parameters) plus attention over its context
(4 x q_heads x head_dim x keys, per layer); only tokens that produce a sampled token pay the LM
head. The input-embedding table is a gather, not a matmul, so it is not counted: counting it (the
common "2 x all parameters" rule, 16.06 GFLOP/token for Llama-3.1-8B) would overstate a bound that
must never exceed what is achievable. Prompt tokens served by the prefix cache (the optional third
workload field) are not computed at all.
Bytes: all matmul weights once per step (a step cannot be shorter than one pass over the weights),
plus per decode token its whole context of K/V, plus one K/V write per computed token.
Steps: at least the longest output (each step yields one token per request), at least total computed
tokens / per-step token budget, and at least total outputs / sequences per step, when those are given.

Torch-free on purpose: ``prefixflow plan --advise`` uses it where torch may be missing;
benchmarks/roofline.py adds the measured ceilings and its command line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Llama-family decoder that the cost model needs (HF config.json keys)."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False

    @classmethod
    def from_config(cls, cfg: dict[str, Any]) -> ModelShape:
        heads = int(cfg["num_attention_heads"])
        return cls(
            hidden_size=int(cfg["hidden_size"]),
            intermediate_size=int(cfg["intermediate_size"]),
            num_layers=int(cfg["num_hidden_layers"]),
            num_q_heads=heads,
            num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            vocab_size=int(cfg["vocab_size"]),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        )

    @property
    def layer_matmul_params(self) -> int:
        """q, k, v, o projections and the gate/up/down MLP of one decoder layer."""
        h, d = self.hidden_size, self.head_dim
        attn = h * self.num_q_heads * d * 2 + h * self.num_kv_heads * d * 2
        return attn + 3 * h * self.intermediate_size

    @property
    def lm_head_params(self) -> int:
        return self.vocab_size * self.hidden_size

    @property
    def matmul_params(self) -> int:
        """Weights a forward pass multiplies by (read once per step)."""
        return self.num_layers * self.layer_matmul_params + self.lm_head_params

    @property
    def embedding_params(self) -> int:
        """The input-embedding table (0 when tied to the LM head, which already counts it)."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def norm_params(self) -> int:
        return (2 * self.num_layers + 1) * self.hidden_size

    @property
    def total_params(self) -> int:
        """Everything in the checkpoint: matmuls, input embedding (unless tied), RMSNorm weights."""
        return self.matmul_params + self.embedding_params + self.norm_params

    def kv_bytes_per_token(self, elem_bytes: float = 2) -> int:
        return int(2 * self.num_layers * self.num_kv_heads * self.head_dim * elem_bytes)

    def attention_flops(self, keys: int) -> int:
        """QK^T and PV for one query token over `keys` keys, all layers."""
        return 4 * self.num_layers * self.num_q_heads * self.head_dim * keys


# (prompt_len, output_len) or (prompt_len, output_len, cached_prompt_tokens) per request
Workload = Sequence[tuple[int, ...]]


@dataclass(frozen=True)
class Ceilings:
    """Machine ceilings: copy bandwidth (bytes read + written per second) and matmul rate."""

    bytes_per_s: float
    flops_per_s: float
    device: str
    dtype: str


@dataclass(frozen=True)
class JobCost:
    flops: float
    bytes: float
    steps: int
    computed_tokens: int
    output_tokens: int
    weight_bytes: float
    kv_read_bytes: float
    kv_write_bytes: float


def _sum_range(a: int, b: int) -> int:
    """a + (a+1) + ... + b, 0 when b < a."""
    return (a + b) * (b - a + 1) // 2 if b >= a else 0


def job_cost(
    shape: ModelShape,
    workload: Workload,
    weight_bytes_per_param: float = 2.0,
    kv_elem_bytes: float = 2,
    max_tokens_per_step: int | None = None,
    max_seqs_per_step: int | None = None,
    scale: float = 1.0,
) -> JobCost:
    """Total FLOPs and bytes of a job; see the module docstring for what is counted.

    ``scale``: the workload is a sample standing for ``scale`` times as many requests (the advisor
    projects a sample to the whole dataset); everything but the longest output scales.
    """
    if scale <= 0:
        raise ValueError(f"scale must be positive, got {scale}")
    kvb = shape.kv_bytes_per_token(kv_elem_bytes)
    flops = kv_read = 0
    computed = outputs = longest = 0
    for item in workload:
        prompt_len, output_len = int(item[0]), int(item[1])
        cached = int(item[2]) if len(item) > 2 else 0
        if prompt_len < 1 or output_len < 1:
            raise ValueError(f"need prompt_len, output_len >= 1, got {(prompt_len, output_len)}")
        if not 0 <= cached < prompt_len:
            raise ValueError(f"need 0 <= cached < prompt_len, got {cached} of {prompt_len}")
        last = prompt_len + output_len - 2  # position of the last fed token (the final sample is never fed)
        tokens = last + 1 - cached
        # token at position p attends to p + 1 keys
        flops += 2 * shape.num_layers * shape.layer_matmul_params * tokens
        flops += 2 * shape.lm_head_params * output_len
        flops += shape.attention_flops(_sum_range(cached + 1, last + 1))
        kv_read += kvb * _sum_range(prompt_len + 1, last + 1)  # decode tokens re-read their context
        computed += tokens
        outputs += output_len
        longest = max(longest, output_len)
    steps = longest
    if max_tokens_per_step:
        steps = max(steps, math.ceil(computed * scale / max_tokens_per_step))
    if max_seqs_per_step:
        steps = max(steps, math.ceil(outputs * scale / max_seqs_per_step))
    weight_bytes = shape.matmul_params * weight_bytes_per_param * steps
    kv_write = kvb * computed * scale
    return JobCost(
        flops=float(flops * scale),
        bytes=float(weight_bytes + kv_read * scale + kv_write),
        steps=steps,
        computed_tokens=round(computed * scale),
        output_tokens=round(outputs * scale),
        weight_bytes=float(weight_bytes),
        kv_read_bytes=float(kv_read * scale),
        kv_write_bytes=float(kv_write),
    )


def lower_bound_seconds(
    shape: ModelShape,
    workload: Workload,
    ceilings: Ceilings,
    weight_bytes_per_param: float = 2.0,
    kv_elem_bytes: float = 2,
    max_tokens_per_step: int | None = None,
    max_seqs_per_step: int | None = None,
    scale: float = 1.0,
) -> float:
    """The job's roofline lower bound in seconds: max(FLOPs / peak, bytes / bandwidth)."""
    cost = job_cost(
        shape, workload, weight_bytes_per_param, kv_elem_bytes, max_tokens_per_step, max_seqs_per_step, scale
    )
    return max(cost.flops / ceilings.flops_per_s, cost.bytes / ceilings.bytes_per_s)
