"""Engine settings: one frozen dataclass, validated at construction so a bad config fails fast."""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass
from typing import Literal

from prefixflow.engine.speculative.config import SpeculativeConfig

Ordering = Literal["prefix", "fifo"]
KernelBackendName = Literal["auto", "torch", "triton"]
LogprobsMode = Literal["raw", "processed"]
CpuInt8 = Literal["auto", "on", "off"]
# quantization=: on the fly, "none" (every layer dense: GGUF blocks dequantized), or (as a check) a
# checkpoint's own method; see docs/models.md "Quantized models"
ONLINE_QUANTIZATION = ("int8", "int4", "fp8")
CHECKPOINT_QUANTIZATION = ("gptq", "awq", "compressed-tensors", "gguf")
QUANTIZATION_CHOICES = ONLINE_QUANTIZATION + ("none",) + CHECKPOINT_QUANTIZATION


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs. Every field has a default that works on a CPU-only machine.

    ``kv_cache_memory_bytes`` sizes the KV pool directly (CPU default 512 MiB); on CUDA, when it is
    None, the pool takes ``gpu_memory_utilization`` of the device memory left after weights and a
    warm-up step.

    ``tensor_parallel_size`` splits one model over that many devices (GPUs, or CPU processes with gloo):
    this process is rank 0 and spawns the others. ``distributed_timeout_s`` bounds how long a rank waits
    for a peer inside a step before a hung worker becomes a ``TensorParallelError``.

    ``kernel_backend`` picks the implementation of all five kernels (KV store, paged attention,
    RMSNorm, rotary, SiLU-and-mul). ``attention_backend`` is its old name, still accepted with a
    ``FutureWarning`` and folded into ``kernel_backend`` (it reads None afterwards).
    """

    model: str = "tiny"
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    device: Literal["auto", "cpu", "cuda"] = "auto"
    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    max_model_len: int | None = None
    kv_cache_memory_bytes: int | None = None
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.90
    enable_prefix_caching: bool = True
    ordering: Ordering = "prefix"
    kernel_backend: KernelBackendName = "auto"
    enforce_eager: bool = False
    seed: int = 0
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = (
        1  # stages of contiguous layers: P x T ranks (docs/engine.md "Pipeline parallelism")
    )
    # micro-batches each step is cut into (None: 1 with virtual engines in flight, else one per stage)
    pipeline_micro_batches: int | None = None
    # steps kept in flight across step boundaries, one per virtual engine (lane of requests); None: one
    # per stage; 1: a single scheduler whose step fills and drains the pipeline (the earlier design)
    pipeline_virtual_engines: int | None = None
    distributed_timeout_s: float = 60.0
    attention_backend: KernelBackendName | None = None  # deprecated alias of kernel_backend
    quantization: str | None = None
    # Which distribution ``SamplingParams.logprobs`` reports (vLLM's ``logprobs_mode``): "raw", the
    # model's own (log-softmax of its logits); "processed", the one the token was drawn from.
    logprobs_mode: LogprobsMode = "raw"
    sparsity: str | None = None  # "2:4": prune a dense model on the fly (docs/models.md "2:4 sparsity")
    kv_offload_bytes: int = (
        0  # host KV tier (all ranks together); 0 = off. docs/engine.md "KV memory hierarchy"
    )
    # persistent KV tier: a local directory of prompt blocks, reused by later runs of the same model
    kv_cache_dir: str | None = None
    kv_cache_dir_bytes: int = 16 * 1024**3  # its size cap (every namespace and rank together), LRU
    # speculative decoding (a mapping is parsed into SpeculativeConfig): docs/engine.md "Speculative decoding"
    speculative_config: SpeculativeConfig | None = None
    # every row's results independent of the rest of the batch, bit for bit (CPU torch kernels only):
    # docs/engine.md "Batch-invariant results"
    batch_invariant: bool = False
    # int8 weights x int8 per-row activations for CPU linear layers (w8a8; kernels/cpu_int8.py): "auto"
    # takes it for an already-quantized checkpoint (GGUF blocks), "on" always, "off" never (float32
    # matmuls). docs/models.md "int8 matmuls on the CPU"
    cpu_int8: CpuInt8 = "auto"

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(f"EngineConfig.{name}={getattr(self, name)!r} is invalid; expected {allowed}")

        if self.attention_backend is not None:
            if self.kernel_backend not in ("auto", self.attention_backend):
                raise ValueError(
                    f"EngineConfig: attention_backend={self.attention_backend!r} (the deprecated name) and "
                    f"kernel_backend={self.kernel_backend!r} disagree; set only kernel_backend"
                )
            warnings.warn(
                "EngineConfig option 'attention_backend' is deprecated (it selects all five kernels); "
                "rename it to 'kernel_backend'",
                FutureWarning,
                stacklevel=3,
            )
            object.__setattr__(self, "kernel_backend", self.attention_backend)
            object.__setattr__(self, "attention_backend", None)
        if self.speculative_config is not None:
            object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise bad("dtype", "one of auto, float32, bfloat16, float16")
        if self.device not in ("auto", "cpu", "cuda"):
            raise bad("device", "one of auto, cpu, cuda")
        if self.block_size < 1 or self.block_size & (self.block_size - 1):
            raise bad("block_size", "a power of two")
        if self.max_num_seqs < 1:
            raise bad("max_num_seqs", "a positive integer")
        if self.max_num_batched_tokens < 1:
            raise bad("max_num_batched_tokens", "a positive integer")
        if self.max_model_len is not None and self.max_model_len < 1:
            raise bad("max_model_len", "a positive integer or None")
        if not 0.0 < self.gpu_memory_utilization <= 1.0:
            raise bad("gpu_memory_utilization", "a fraction in (0, 1]")
        if self.num_kv_blocks is not None and self.num_kv_blocks < 2:
            raise bad("num_kv_blocks", "at least 2")
        if self.ordering not in ("prefix", "fifo"):
            raise bad("ordering", "'prefix' or 'fifo'")
        if self.kernel_backend not in ("auto", "torch", "triton"):
            raise bad("kernel_backend", "one of auto, torch, triton")
        if self.logprobs_mode not in ("raw", "processed"):
            raise bad("logprobs_mode", "'raw' (the model's distribution) or 'processed' (the sampled one)")
        if self.quantization is not None and self.quantization not in QUANTIZATION_CHOICES:
            raise bad("quantization", f"None or one of {', '.join(QUANTIZATION_CHOICES)}")
        if not isinstance(self.batch_invariant, bool):
            raise bad("batch_invariant", "true or false")
        if self.batch_invariant and (self.device == "cuda" or self.kernel_backend == "triton"):
            raise bad(
                "batch_invariant",
                "false on CUDA / Triton kernels (batch-invariant results need the CPU torch kernels)",
            )
        if self.cpu_int8 not in ("auto", "on", "off"):
            raise bad("cpu_int8", "'auto' (int8 for quantized checkpoints on the CPU), 'on' or 'off'")
        if self.cpu_int8 == "on" and self.device == "cuda":
            raise bad("cpu_int8", "'auto' or 'off' on CUDA (the int8 matmul path is for CPU devices)")
        if self.sparsity not in (None, "2:4"):
            raise bad("sparsity", "None or '2:4'")
        if (
            isinstance(self.tensor_parallel_size, bool)
            or not isinstance(self.tensor_parallel_size, int)
            or self.tensor_parallel_size < 1
        ):
            raise bad("tensor_parallel_size", "a positive integer (the number of devices one engine uses)")
        for name in ("pipeline_parallel_size",):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(name, "a positive integer (the number of pipeline stages)")
        if self.pipeline_micro_batches is not None and (
            isinstance(self.pipeline_micro_batches, bool)
            or not isinstance(self.pipeline_micro_batches, int)
            or self.pipeline_micro_batches < 1
        ):
            raise bad("pipeline_micro_batches", "None or a positive integer")
        if self.pipeline_virtual_engines is not None and (
            isinstance(self.pipeline_virtual_engines, bool)
            or not isinstance(self.pipeline_virtual_engines, int)
            or self.pipeline_virtual_engines < 1
        ):
            raise bad("pipeline_virtual_engines", "None or a positive integer (steps kept in flight)")
        if (
            isinstance(self.kv_offload_bytes, bool)
            or not isinstance(self.kv_offload_bytes, int)
            or self.kv_offload_bytes < 0
        ):
            raise bad(
                "kv_offload_bytes", "a non-negative integer number of bytes (0 turns the host KV tier off)"
            )
        if self.kv_cache_dir is not None:
            if isinstance(self.kv_cache_dir, os.PathLike):
                object.__setattr__(self, "kv_cache_dir", os.fspath(self.kv_cache_dir))
            if not isinstance(self.kv_cache_dir, str) or not self.kv_cache_dir.strip():
                raise bad("kv_cache_dir", "None or the path of a local directory for the persistent KV tier")
        if (
            isinstance(self.kv_cache_dir_bytes, bool)
            or not isinstance(self.kv_cache_dir_bytes, int)
            or self.kv_cache_dir_bytes < 1
        ):
            raise bad(
                "kv_cache_dir_bytes", "a positive integer number of bytes (the persistent KV tier's size cap)"
            )
        if not self.distributed_timeout_s > 0:
            raise bad("distributed_timeout_s", "a positive number of seconds")
