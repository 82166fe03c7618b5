"""Reload or recompute: the engine's estimate of which gets a run of cached blocks back sooner.

Recompute costs the prefill FLOPs of those tokens (2 x parameters per token, plus attention over the
context) at the device's sustained rate; a reload costs their KV bytes over the host link plus a fixed
latency per reload (stream hand-off, the scatter kernel). The fixed cost is why a short run may still
be recomputed. The rates are conservative defaults, not measurements of this machine: prefill rarely
reaches peak, and pinned PCIe copies come close to their ceiling, so reloading wins early on GPUs.
"""

from __future__ import annotations

from dataclasses import dataclass

from prefixflow.engine.loading.model_config import ModelConfig

# (sustained prefill FLOP/s, host<->device bytes/s, fixed seconds per reload)
RATES = {
    "cuda": (300e12, 20e9, 50e-6),  # H100/H200-class bf16 prefill; PCIe 5 x16 pinned copies
    "cpu": (50e9, 5e9, 20e-6),  # a few cores of fp32 GEMM; a memcpy-bound copy
}
# The disk tier (kv_cache_dir): read bytes/s (a local NVMe or the page cache, checksum included) and
# seconds per block file (open, read, checksum, close). The per-file cost keeps the small blocks of
# small models (where recompute is cheap) recomputed. Measured on this project's CPU host from the page
# cache: about 30 us of CPU per file plus 1.7 GB/s (checksum included); rounded to leave a margin.
DISK_RATE = (1.5e9, 50e-6)


def parameters(mc: ModelConfig) -> int:
    """Matrix parameters one token passes through (embeddings are a lookup, the LM head is not
    needed for cached prompt positions)."""
    attn = mc.hidden_size * mc.head_dim * (2 * mc.num_heads + 2 * mc.num_kv_heads)
    mlp = 3 * mc.hidden_size * mc.intermediate_size
    return mc.num_layers * (attn + mlp)


@dataclass(frozen=True)
class CostModel:
    flops_per_token: float
    kv_bytes_per_token: float  # all ranks together
    attention_flops_per_token_per_context: float
    flops_per_s: float
    copy_bytes_per_s: float
    reload_latency_s: float
    disk_bytes_per_s: float = DISK_RATE[0]
    disk_file_s: float = DISK_RATE[1]

    @classmethod
    def for_model(cls, mc: ModelConfig, dtype_bytes: int, device_type: str) -> CostModel:
        flops, bandwidth, latency = RATES.get(device_type, RATES["cpu"])
        return cls(
            flops_per_token=2.0 * parameters(mc),
            kv_bytes_per_token=float(mc.kv_bytes_per_token * dtype_bytes),
            attention_flops_per_token_per_context=4.0 * mc.num_layers * mc.num_heads * mc.head_dim,
            flops_per_s=flops,
            copy_bytes_per_s=bandwidth,
            reload_latency_s=latency,
            disk_bytes_per_s=DISK_RATE[0],
            disk_file_s=DISK_RATE[1],
        )

    def recompute_s(self, start: int, num_tokens: int) -> float:
        """Prefill of positions start .. start + num_tokens - 1 (attention grows with the context)."""
        mean_context = start + num_tokens / 2
        per_token = self.flops_per_token + self.attention_flops_per_token_per_context * mean_context
        return num_tokens * per_token / self.flops_per_s

    def reload_s(self, num_tokens: int) -> float:
        return self.reload_latency_s + num_tokens * self.kv_bytes_per_token / self.copy_bytes_per_s

    def reload_cheaper(self, start: int, num_tokens: int) -> bool:
        return num_tokens > 0 and self.reload_s(num_tokens) < self.recompute_s(start, num_tokens)

    def disk_s(self, num_tokens: int, num_blocks: int) -> float:
        """Read ``num_blocks`` files into host memory, then reload them like host hits."""
        read = num_blocks * self.disk_file_s + num_tokens * self.kv_bytes_per_token / self.disk_bytes_per_s
        return read + self.reload_s(num_tokens)

    def disk_cheaper(self, start: int, num_tokens: int, num_blocks: int) -> bool:
        return num_tokens > 0 and self.disk_s(num_tokens, num_blocks) < self.recompute_s(start, num_tokens)
