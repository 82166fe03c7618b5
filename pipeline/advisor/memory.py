"""Memory arithmetic from the checkpoint's config: weight bytes per precision, KV bytes per token, and how
many tokens and sequences fit on a device with what the engine leaves for its KV pool.

Quantized precisions cover the decoder's linear layers, laid out as the engine's own quantization stores
them (engine/quantization/online.py; a test checks the two agree): 8-bit weights with one float32 scale
per output channel; int4 with a float16 scale and a float16 zero per group of 128 inputs (a partial last
group counts as one). The input embedding, the LM head and the norms stay in the compute dtype.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from prefixflow.pipeline.advisor.devices import GIB, Device
from prefixflow.pipeline.advisor.roofline import ModelShape

PRECISIONS = ("bf16", "fp8", "int8", "int4")  # on the CPU the engine's own precision is fp32, not bf16
BITS = {
    "fp32": 4.0,
    "bf16": 2.0,
    "fp16": 2.0,
    "fp8": 1.0,
    "int8": 1.0,
    "int4": 0.5,
}  # bytes per linear weight
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
INT4_GROUP = 128
GPU_RESERVED_BYTES = GIB  # CUDA context, cuBLAS workspace, CUDA graphs: outside the engine's own tensors
HEADROOM = 0.80  # weights above this share of device memory leave too little for the KV cache


def native_precision(device: Device) -> str:
    """The precision the engine runs unquantized weights in on this device."""
    return "fp32" if device.dtype == "float32" else "bf16"


def quant_order(device: Device) -> tuple[str, ...]:
    """Quantized precisions to try, best first: fp8 W8A8 where the chip has fp8 math, else int8; then int4."""
    return ("fp8", "int4") if "fp8" in device.flops else ("int8", "int4")


def precisions_for(device: Device) -> tuple[str, ...]:
    return (native_precision(device), *PRECISIONS[1:])


def crossover_tokens(device: Device, precision: str) -> float:
    """Tokens per step at which a pass over the weights turns compute-bound: 2 P M / peak = P b / BW.
    Below it, decode steps wait on reading weights; a KV pool that cannot hold this many sequences
    leaves the device underused."""
    return device.peak(precision) * BITS[precision] / (2 * device.bytes_per_s)


def _linears(shape: ModelShape) -> list[tuple[int, int]]:
    """(output, input) features of one decoder layer's q, k, v, o, gate, up and down projections."""
    h, i, d = shape.hidden_size, shape.intermediate_size, shape.head_dim
    q, kv = shape.num_q_heads * d, shape.num_kv_heads * d
    return [(q, h), (kv, h), (kv, h), (h, q), (i, h), (i, h), (h, i)]


def weight_bytes(shape: ModelShape, precision: str) -> int:
    """Bytes of all weights with the decoder's linear layers stored at ``precision``."""
    layer = 0.0
    for n, k in _linears(shape):
        layer += n * k * BITS[precision]
        if precision in ("fp8", "int8"):
            layer += n * 4  # float32 scale per output channel
        elif precision == "int4":
            layer += n * -(-k // INT4_GROUP) * 4  # float16 scale + float16 zero per group
    rest = shape.total_params - shape.num_layers * shape.layer_matmul_params  # embedding, LM head, norms
    return int(shape.num_layers * layer + rest * (4 if precision == "fp32" else 2))


def activation_bytes(shape: ModelShape, tokens: int, seqs: int, elem: int) -> int:
    """Peak activations of the largest step (``tokens`` batched tokens, ``seqs`` sampled rows): hidden
    states, attention and MLP intermediates, and float32 logits plus their softmax. An estimate: the
    engine measures this on the GPU by running that step once before sizing its KV pool."""
    h, i = shape.hidden_size, shape.intermediate_size
    qkv = (shape.num_q_heads + 2 * shape.num_kv_heads) * shape.head_dim
    per_token = (3 * h + qkv + 3 * i) * elem
    return int(tokens * per_token + min(seqs, tokens) * shape.vocab_size * 4 * 2)


@dataclass(frozen=True)
class Footprint:
    """KV a running sequence holds on its own (prompt + output minus what the prefix cache shares), the
    blocks shared by all of them (the longest common head, kept once), and whether the job decodes."""

    private_mean: float = 1.0
    private_p99: float = 1.0
    shared_blocks: int = 0
    decodes: bool = True


@dataclass(frozen=True)
class Fit:
    """What one device holds for one weight precision (bytes, tokens and sequences are whole numbers)."""

    precision: str
    weight_bytes: int
    weight_share: float  # of device memory
    kv_pool_bytes: int
    kv_blocks: int
    kv_tokens: int
    max_model_len: int  # the longest context that fits the model and the pool
    seqs_at_mean: int  # sequences of the sample's mean size that fit at once
    seqs_at_p99: int  # ... of its 99th-percentile size (no preemption even for long rows)
    batch_target: int  # sequences a step needs: min(max_num_seqs, the compute crossover)
    pool_from_memory: bool  # False when the pool is fixed (CPU default, kv_cache_memory_bytes, num_kv_blocks)

    @property
    def fits(self) -> bool:
        return self.kv_blocks >= 2 and self.weight_share <= 1.0

    @property
    def kv_limited(self) -> bool:
        """The weights leave a pool too small for the batch a step needs (smaller weights would help)."""
        return self.pool_from_memory and self.seqs_at_mean < self.batch_target

    @property
    def headroom(self) -> bool:
        """Weights within ``HEADROOM`` of memory, and a KV pool that holds the batch a step needs."""
        return self.fits and self.weight_share <= HEADROOM and not self.kv_limited


@dataclass(frozen=True)
class EngineLimits:
    """The engine settings that decide the KV pool (job ``engine:`` section, or EngineConfig defaults)."""

    block_size: int = 16
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 4096
    max_model_len: int | None = None
    kv_cache_memory_bytes: int | None = None
    num_kv_blocks: int | None = None
    gpu_memory_utilization: float = 0.90
    tensor_parallel_size: int = 1

    @classmethod
    def from_engine(cls, engine: dict[str, Any]) -> EngineLimits:
        known = {k: v for k, v in engine.items() if k in cls.__dataclass_fields__ and v is not None}
        return cls(**known)


def model_context_limit(cfg: dict[str, Any], limits: EngineLimits) -> int:
    """The context limit before the KV pool: the model's positions, the configured max_model_len, and the
    sliding window (the engine stays within it, where full attention is exact)."""
    out = [int(cfg.get("max_position_embeddings", 4096))]
    if limits.max_model_len:
        out.append(limits.max_model_len)
    if cfg.get("sliding_window") and cfg.get("use_sliding_window", True):
        out.append(int(cfg["sliding_window"]))
    return min(out)


def fit(
    shape: ModelShape,
    cfg: dict[str, Any],
    device: Device,
    limits: EngineLimits,
    precision: str,
    seqs: Footprint = Footprint(),
) -> Fit:
    """KV pool as the engine sizes it: ``num_kv_blocks`` or ``kv_cache_memory_bytes`` when set; on a GPU
    ``gpu_memory_utilization`` of memory minus weights, peak activations and a reserve; on the CPU the
    engine's 512 MiB default. Sequences that fit: the pool less the shared head, over each sequence's
    own blocks. A job that only prefills (label scoring) needs no batch of sequences to use the device."""
    elem = DTYPE_BYTES.get(device.dtype, 2)
    weights = weight_bytes(shape, precision)
    block_bytes = shape.kv_bytes_per_token(elem) * limits.block_size
    from_memory = False
    if limits.num_kv_blocks is not None:
        pool = limits.num_kv_blocks * block_bytes
    elif limits.kv_cache_memory_bytes is not None:
        pool = limits.kv_cache_memory_bytes
    elif device.kv_pool_bytes is not None:
        pool = device.kv_pool_bytes
    else:
        from_memory = True
        act = activation_bytes(shape, limits.max_num_batched_tokens, limits.max_num_seqs, elem)
        pool = int(device.memory_bytes * limits.gpu_memory_utilization) - weights - act - GPU_RESERVED_BYTES
    pool = max(pool, 0)
    blocks = pool // block_bytes
    tokens = blocks * limits.block_size
    mean_blocks = max(1.0, -(-seqs.private_mean // limits.block_size))
    p99_blocks = max(1.0, -(-seqs.private_p99 // limits.block_size))
    room = max(blocks - seqs.shared_blocks, 0)
    return Fit(
        precision=precision,
        weight_bytes=weights,
        weight_share=weights / device.memory_bytes,
        kv_pool_bytes=int(pool),
        kv_blocks=int(blocks),
        kv_tokens=int(tokens),
        max_model_len=int(min(model_context_limit(cfg, limits), tokens)),
        seqs_at_mean=int(room // mean_blocks),
        seqs_at_p99=int(room // p99_blocks),
        batch_target=min(limits.max_num_seqs, math.ceil(crossover_tokens(device, precision)))
        if seqs.decodes
        else 1,
        pool_from_memory=from_memory,
    )


MAX_TP = 64  # the largest tensor-parallel group the advisor considers


def choose_precision(
    shape: ModelShape,
    cfg: dict[str, Any],
    device: Device,
    limits: EngineLimits,
    seqs: Footprint = Footprint(),
) -> tuple[str, int]:
    """What question 1 picks: the native precision if it leaves headroom, else the first quantized one that
    does, else the smallest tensor-parallel group (of native weights) that does, else the smallest group
    that fits at all, else ``MAX_TP`` (and ``fit`` on that group says it does not fit)."""
    native = native_precision(device)
    for p in (native, *quant_order(device)):
        if fit(shape, cfg, device, limits, p, seqs).headroom:
            return p, 1
    groups = [1 << k for k in range(1, MAX_TP.bit_length())]
    fits = [(tp, fit(shape, cfg, device.group(tp), limits, native, seqs)) for tp in groups]
    for tp, x in fits:
        if x.headroom:
            return native, tp
    return native, next((tp for tp, x in fits if x.fits), MAX_TP)
