"""Counters an operator reads to see what the engine did and how well the prefix cache worked."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class EngineStats:
    steps: int = 0
    requests: int = 0
    error_requests: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    computed_prompt_tokens: int = 0  # includes recompute after preemption
    output_tokens: int = 0  # tokens of the requests handed back (counted when a request finishes)
    generated_tokens: int = 0  # tokens sampled, counted at every step (what live progress reads)
    preemptions: int = 0
    elapsed_s: float = 0.0
    host_s: float = 0.0  # scheduling, step preparation and bookkeeping: time the device waits
    mask_fill_s: float = 0.0  # structured outputs: grammar bitmask fills (on a worker thread)
    mask_wait_s: float = 0.0  # structured outputs: time the step loop waited for a fill
    masked_steps: int = 0  # steps that sampled at least one constrained request
    mask_overlapped_steps: int = 0  # of those, steps whose fill ran on the worker while the model ran
    kv_host_blocks: int = 0  # host KV tier capacity in blocks (0: no host tier)
    kv_offloaded_tokens: int = 0  # tokens of evicted device blocks copied to the host tier
    kv_reloaded_tokens: int = 0  # cached tokens copied back from the host tier instead of computed
    kv_recomputed_tokens: int = 0  # tokens computed again after a preemption dropped their KV
    kv_host_lookups: int = 0  # host-tier probes after a device miss
    kv_host_hits: int = 0
    # the persistent tier (kv_cache_dir): blocks looked for, read, written (bytes: KV of every rank)
    kv_disk_lookups: int = 0  # prefixes that continued past the host tier and were looked for on disk
    kv_disk_hits: int = 0  # blocks read from disk (checked on every rank) instead of recomputed
    kv_disk_loaded_tokens: int = 0
    kv_disk_read_bytes: int = 0
    kv_disk_written_tokens: int = 0  # computed prompt tokens whose blocks were handed to the writers
    kv_disk_written_bytes: int = 0
    kv_disk_declined_tokens: int = 0  # found on disk, but the cost model chose recompute
    kv_disk_failed_blocks: int = 0  # found, then not read: corrupt, evicted meanwhile, missing on a rank
    kv_disk_corrupt_files: int = 0  # rank 0's files that failed the checksum or header (removed)
    weight_bytes: int = 0  # parameters and buffers the model holds on its device (after repacking)
    quantization: str = "none"  # the model's quantization method (docs/models.md "Quantized models")
    # speculative decoding, per method: proposed, accepted, runs, acceptance_rate, mean_accepted_length
    speculation: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def host_ms_per_step(self) -> float:
        return 1000 * self.host_s / self.steps if self.steps else 0.0

    @property
    def mask_ms_per_step(self) -> float:
        """Bitmask fill time per constrained step (most of it hidden behind the model's forward pass)."""
        return 1000 * self.mask_fill_s / self.masked_steps if self.masked_steps else 0.0

    @property
    def prefix_hit_rate(self) -> float:
        return self.cached_prompt_tokens / self.prompt_tokens if self.prompt_tokens else 0.0

    @property
    def host_hit_rate(self) -> float:
        """Host-tier probes that found the block (each run of hits ends in one miss, unless the prompt ends)."""
        return self.kv_host_hits / self.kv_host_lookups if self.kv_host_lookups else 0.0

    @property
    def tokens_per_s(self) -> float:
        """Output tokens per second of engine time."""
        return self.output_tokens / self.elapsed_s if self.elapsed_s else 0.0

    @property
    def total_tokens_per_s(self) -> float:
        done = self.computed_prompt_tokens + self.output_tokens
        return done / self.elapsed_s if self.elapsed_s else 0.0

    def as_dict(self) -> dict[str, Any]:
        return {
            **asdict(self),
            "prefix_hit_rate": self.prefix_hit_rate,
            "host_hit_rate": self.host_hit_rate,
            "tokens_per_s": self.tokens_per_s,
            "total_tokens_per_s": self.total_tokens_per_s,
            "host_ms_per_step": self.host_ms_per_step,
            "mask_ms_per_step": self.mask_ms_per_step,
        }
