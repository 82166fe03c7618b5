"""Whether a GGUF file's Q8_0/Q4_0/Q4_1 layers stay packed or are dequantized once at load.

Why: on the CPU with float32 activations no packed kernel beats the dense float32 matmul (torch's
int4/int8 pack ops have no fast float32 path, and dequantizing chunks per call costs 1.7-5x the
dense matmul: RESULTS.md "Issue 24" and "Issue 12"), so the embedded Q4_1 SmolLM2 ran at 0.73x its
own dense path. The rule, decided from the model's shapes and the host before any weight is read
(so ``describe_model`` reports the same choice the engine makes):

- CPU, float32, no ``quantization=`` given, and the dense weights take at most 1/8 of the memory
  this process may use (the smaller of physical memory and the cgroup limit): **dense+packed**, the
  checkpoint's dequantization to dense float32 bit for bit (only the summation order of the matmul
  differs) for products of more than 64 rows, and the file's blocks through the native matvec for
  decodes of 1-64 rows, which streams a sixth of the bytes (1.05-3.6x the dense matmul per step at
  64 to 1 rows on AVX2, RESULTS.md issue 24 "Fifteenth round" and "Sixteenth round"); a tied Q8_0 embedding serves those
  decodes as the LM head in its blocks too (``packed_head``); **dense** where the matvec cannot run (no
  C compiler, no AVX2);
- for bfloat16/float16 activations on a CPU with native bf16 matmuls (AMX, AVX512-BF16) **dense+packed**:
  the dense bf16 matmul is 1.5-2x faster than torch's int4 pack op from batch 16 on, but products of
  one to four rows (decodes at batch 1-4) ran faster on the packed blocks (batch 1 1.3x end to end on
  Zen 5, RESULTS.md issue 24 "Eleventh round"), so each layer keeps both and picks by the row count
  (engine/quantization/dual_gguf.py; the packed copy adds a quarter of the dense bytes);
- otherwise **packed**: on CUDA (the Triton kernels read 4-8x fewer bytes), with bfloat16/float16
  activations on a CPU without native bf16 (torch's pack ops beat the dense matmul there), when memory
  requires it, or when ``quantization="gguf"`` asks for it.

``quantization="none"`` still forces dense everywhere. Checkpoint formats other than GGUF (GPTQ,
AWQ, compressed-tensors) keep their own kernels: their files hold no dense weights to fall back on
without dequantizing an often much larger model.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from prefixflow.engine.dtypes import DTYPE_BYTES
from prefixflow.engine.quantization.config import QuantizationConfig
from prefixflow.engine.quantization.dual_gguf import FLOAT32_PACKED_MAX_ROWS, PACKED_MAX_ROWS, DualGGUFMethod
from prefixflow.engine.quantization.gguf_blocks import BLOCK_BYTES, GGUFConfig, GGUFMethod
from prefixflow.engine.quantization.method import DenseMethod, LinearMethod
from prefixflow.kernels import cpu_gguf_matvec

MEMORY_SHARE = 8  # dense weights may take 1/MEMORY_SHARE of usable memory (KV pool, activations, others)


@dataclass(frozen=True)
class WeightPath:
    """The path taken and why, as ``describe_model`` and ``llm.model_identity`` report it."""

    path: Literal["packed", "dense", "dense+packed"]
    reason: str

    def describe(self) -> dict[str, Any]:
        return {"path": self.path, "reason": self.reason}


@dataclass(frozen=True)
class DequantizedGGUFConfig(GGUFConfig):
    """A GGUF file whose packed layers run dense: every linear layer dequantizes its blocks at load."""

    def linear_method(self, prefixes: Any) -> LinearMethod:
        return DenseMethod()

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        return {
            **described,
            "packed": [],
            "dequantized": sorted({*described["packed"], *described["dequantized"]}),
        }


@dataclass(frozen=True)
class DualGGUFConfig(GGUFConfig):
    """A GGUF file whose packed layers keep their blocks and a dense copy (``DualGGUFMethod``)."""

    def linear_method(self, prefixes: Any) -> LinearMethod:
        method = super().linear_method(prefixes)
        return DualGGUFMethod(method.kind) if isinstance(method, GGUFMethod) else method

    def describe(self) -> dict[str, Any]:
        described = super().describe()
        return {**described, "dense_copy": described["packed"]}


def usable_memory_bytes() -> int | None:
    """Physical memory, or the cgroup's limit when lower; None where neither can be read."""
    found: list[int] = []
    try:
        found.append(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        pass
    for limit in (Path("/sys/fs/cgroup/memory.max"), Path("/sys/fs/cgroup/memory/memory.limit_in_bytes")):
        try:
            text = limit.read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:  # "max" or a huge number: no limit
            found.append(int(text))
    return min(found) if found else None


def packed_kinds(quant: QuantizationConfig) -> list[str]:
    if not isinstance(quant, GGUFConfig) or isinstance(quant, DequantizedGGUFConfig):
        return []
    linear = (t for name, t in quant.tensor_types.items() if "_proj." in name or name.startswith("lm_head."))
    return sorted({t for t in linear if t in BLOCK_BYTES})


def choose_weight_path(
    quant: QuantizationConfig,
    requested: str | None,
    device: str,
    dtype: str,
    dense_bytes: int,
    memory_bytes: int | None = None,
    native: bool | None = None,
    matvec: bool | None = None,
    cpu_int8: str = "auto",
) -> WeightPath | None:
    """The path for a GGUF model's packed layers (None for anything else). ``dense_bytes``: what those
    layers take dense in ``dtype``; ``memory_bytes``: usable memory, ``native``: native bf16 matmuls,
    ``matvec``: the native float32 matvec of the blocks builds here (all read from the host when None);
    ``cpu_int8``: ``EngineConfig.cpu_int8`` ("on" runs the dense layers in int8, so they are dense)."""
    kinds = packed_kinds(quant)
    if not kinds:
        return None
    blocks = "/".join(kinds)
    if requested is not None:
        return WeightPath("packed", f"quantization={requested!r} asks for the file's {blocks} blocks")
    if device != "cpu":
        return WeightPath(
            "packed", f"{device}: the packed {blocks} kernels read 4-8x fewer weight bytes than dense"
        )
    native = native_bf16() if native is None else native
    if dtype != "float32" and not native:
        return WeightPath(
            "packed",
            f"cpu, {dtype}: without native bf16 matmuls (AMX, AVX512-BF16) torch's "
            f"int4/int8 pack matmuls beat the dense {dtype} matmul",
        )
    memory = memory_bytes if memory_bytes is not None else usable_memory_bytes()
    mib = dense_bytes / 2**20
    if memory is None or dense_bytes * MEMORY_SHARE > memory:
        have = "unknown" if memory is None else f"{memory / 2**20:,.0f} MiB"
        return WeightPath(
            "packed",
            f"cpu, {dtype}: dense weights would take {mib:,.0f} MiB, over 1/{MEMORY_SHARE} of usable memory "
            f"({have}); {blocks} stays packed (slower per token, but it fits)",
        )
    if cpu_int8 == "on":
        return WeightPath(
            "dense",
            f"cpu, {dtype}: {blocks} dequantized at load to dense {dtype} ({mib:,.0f} MiB), because "
            "cpu_int8='on' runs every dense layer in int8 (engine/quantization/int8_path.py)",
        )
    if dtype != "float32":
        return WeightPath(
            "dense+packed",
            f"cpu, {dtype}: {blocks} dequantized at load to dense {dtype} ({mib:,.0f} MiB) for products of more "
            f"than {PACKED_MAX_ROWS} rows, because this CPU multiplies bf16 natively and the dense matmul beats "
            f"the pack ops from batch 16 on; the {blocks} blocks kept too for products of {PACKED_MAX_ROWS} rows "
            f"or fewer (decodes at batch 1-{PACKED_MAX_ROWS}), where reading a quarter of the bytes wins "
            "(benchmarks/RESULTS.md 'Issue 24'; dtype='auto' takes bf16 here for a GGUF block file, "
            "dtype='float32' for float32 numerics); quantization='gguf' keeps it packed only",
        )
    if cpu_gguf_matvec.available() if matvec is None else matvec:
        return WeightPath(
            "dense+packed",
            f"cpu, {dtype}: {blocks} dequantized at load to dense {dtype} ({mib:,.0f} MiB) for products of more "
            f"than {FLOAT32_PACKED_MAX_ROWS} rows, where the dense matmul is fastest; the {blocks} blocks kept "
            f"as they lie for products of {FLOAT32_PACKED_MAX_ROWS} rows or fewer (decodes at batch "
            f"1-{FLOAT32_PACKED_MAX_ROWS}) on the native matvec, which streams a sixth of the bytes "
            "(benchmarks/RESULTS.md 'Issue 24', 'Fifteenth round'); quantization='gguf' keeps it packed only",
        )
    why = "no packed float32 CPU kernel is as fast as the dense matmul here (the native matvec needs a C compiler and AVX2)"
    return WeightPath(
        "dense",
        f"cpu, {dtype}: {blocks} dequantized at load to dense {dtype} ({mib:,.0f} MiB), because {why} "
        "(benchmarks/RESULTS.md 'Issue 24'); quantization='gguf' keeps it packed",
    )


def cpu_auto_dtype(gguf_file: Path | None, native: bool | None = None) -> str:
    """``dtype="auto"`` on the CPU: bfloat16 for a GGUF file of Q8_0/Q4_0/Q4_1 blocks on a CPU with
    native bf16 matmuls (``native``; read from the host when None), float32 otherwise.

    Why: such a file's weights are already 4-8-bit approximations, and there dense bf16 ran 1.5-2x
    dense float32 from batch 16 on (and never slower at batch 1): benchmarks/RESULTS.md "Issue 24".
    Float32 checkpoints keep float32 (transformers' float32 numerics); ``dtype="float32"`` asks for it."""
    if gguf_file is None or gguf_dense_bytes(gguf_file, "float32") == 0:
        return "float32"
    return "bfloat16" if (native_bf16() if native is None else native) else "float32"


def native_bf16() -> bool:
    """Whether this CPU has bf16 matmul instructions (AMX tiles or AVX512-BF16) that torch uses."""
    from prefixflow.kernels.cpu_features import amx_tiles, avx512_bf16

    return amx_tiles() or avx512_bf16()


PACKED_HEAD = True  # False: the tied head always dense (benchmarks/cpu_path.py's ``pf-dense-head``)


def packed_head(path: WeightPath | None, dtype: str, batch_invariant: bool = False) -> bool:
    """Whether a tied LM head is kept as Q8_0 blocks too, for decodes of few float32 rows (the layers'
    dense+packed path in float32; llama.LlamaForCausalLM.use_packed_head, where the blocks must be
    recovered exactly). Batch-invariant mode multiplies at least 16 rows, so never there."""
    return (
        PACKED_HEAD
        and path is not None
        and path.path == "dense+packed"
        and dtype == "float32"
        and not batch_invariant
    )


def apply_weight_path(quant: QuantizationConfig, path: WeightPath | None) -> QuantizationConfig:
    """The config the model is built with once ``path`` is chosen."""
    if path is not None and path.path == "dense" and isinstance(quant, GGUFConfig):
        return DequantizedGGUFConfig(dict(quant.tensor_types))
    if path is not None and path.path == "dense+packed" and isinstance(quant, GGUFConfig):
        return DualGGUFConfig(dict(quant.tensor_types))
    return quant


def weight_path_for(
    quant: QuantizationConfig,
    requested: str | None,
    device: str,
    dtype: str,
    gguf_file: Path | None,
    cpu_int8: str = "auto",
) -> WeightPath | None:
    """``choose_weight_path`` for a model read from ``gguf_file`` (None: an in-memory source, kept as is)."""
    if not packed_kinds(quant) or gguf_file is None:
        return None
    dense = gguf_dense_bytes(gguf_file, dtype)
    return choose_weight_path(quant, requested, device, dtype, dense, cpu_int8=cpu_int8)


def gguf_dense_bytes(path: Path, dtype: str) -> int:
    """Bytes the file's Q8_0/Q4_0/Q4_1 linear weights take dense in ``dtype`` (from its tensor table)."""
    from gguf import GGMLQuantizationType

    from prefixflow.engine.gguf.header import gguf_tensor_table
    from prefixflow.engine.gguf.tensors import hf_name

    total = 0
    for name, dims, type_id in gguf_tensor_table(path):
        hf = hf_name(name)
        if hf is None or GGMLQuantizationType(type_id).name not in BLOCK_BYTES:
            continue
        if "_proj." in hf or hf == "lm_head.weight":
            numel = 1
            for d in dims:
                numel *= d
            total += numel * DTYPE_BYTES[dtype]
    return total
