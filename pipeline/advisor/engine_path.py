"""Which weight path the engine will run for the job's model on the target device: ``describe_model``'s
``quantization`` and ``weight_path`` (no weights read), so the estimate prices what the engine does.

The engine keeps the quantized formats it supports packed (GPTQ, AWQ, compressed-tensors, and GGUF
Q8_0/Q4_0/Q4_1 except where a dense float32 copy is faster: the CPU in float32 with memory to spare,
engine/quantization/weight_path.py), quantizes a full-precision checkpoint when the job says
``quantization: int8|int4|fp8``, and runs everything dense with ``quantization: none``. On the CPU in
float32 a packed path is 1.7-5.2x slower per layer than the dense matmul (benchmarks/RESULTS.md
"Quantized weights on the CPU"): a dense-float32 prediction of a packed Q4_1 run was 4.5x too fast.

``describe_model`` imports torch; where torch is missing (the advisor is torch-free without --pilot)
the path is read from the checkpoint's stored format and the job's setting with the same rules.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

GGUF_PACKED = {"Q4_0": "int4", "Q4_1": "int4", "Q8_0": "int8"}  # block types the engine can keep packed
ONLINE = ("int8", "int4", "fp8")
CPU_FLOAT32_PACKED_SLOWDOWN = (1.7, 5.2)  # per layer, packed quantized vs dense float32 (RESULTS.md)
DENSE_SHARE = 8  # engine/quantization/weight_path.py: dense GGUF weights may take 1/8 of usable memory


@dataclass(frozen=True)
class EnginePath:
    method: str  # describe_model's quantization method: none, gguf, gptq, awq, compressed-tensors, int8 ...
    precision: str | None  # the advisor's precision class of the packed linear layers; None: dense
    label: str  # what the report shows, e.g. "gguf Q4_1, packed"
    source: str = "describe_model"  # or "checkpoint format" (no torch)


DENSE = EnginePath("none", None, "dense")


def from_description(described: dict[str, Any]) -> EnginePath:
    """``describe_model(...)`` -> the path."""
    quant = described.get("quantization") or {}
    method = str(quant.get("method") or "none")
    weight_path = (described.get("weight_path") or {}).get("path")
    if method == "none" or weight_path == "dense":
        kinds = quant.get("dequantized") or []
        return EnginePath(
            method, None, f"{method} {'/'.join(kinds)} dequantized, dense" if kinds else "dense"
        )
    if weight_path == "dense+packed" and described.get("dtype") == "float32":
        # the dense float32 copy runs every product of more rows than a decode step has (64); decodes
        # take the blocks and run faster, so pricing it dense is the cautious side
        kinds = [k for k in quant.get("packed") or [] if k in GGUF_PACKED]
        return EnginePath(method, None, f"{method} {'/'.join(kinds)} dense (+ blocks for decodes)")
    if method == "gguf":
        kinds = [k for k in quant.get("packed") or [] if k in GGUF_PACKED]
        if not kinds:
            return EnginePath(method, None, "gguf, dequantized, dense")
        precision = "int4" if any(GGUF_PACKED[k] == "int4" for k in kinds) else "int8"
        return EnginePath(method, precision, f"gguf {'/'.join(kinds)}, packed")
    if method in ONLINE:
        return EnginePath(method, method, f"{method}, quantized while loading")
    bits = quant.get("bits")
    schemes = quant.get("schemes") or []
    if bits is None and schemes:
        bits = schemes[0].get("bits")
        if str(schemes[0].get("format", "")).startswith("float"):
            return EnginePath(method, "fp8", f"{method} fp8, packed")
    precision = "int8" if bits == 8 else "int4"
    return EnginePath(method, precision, f"{method} int{bits or 4}, packed")


def from_checkpoint(
    checkpoint_precision: str,
    job_quantization: str | None,
    on_cpu_float32: bool = False,
    dense_bytes: int = 0,
    memory_bytes: int = 0,
) -> EnginePath:
    """The same rules from ``ModelCard.checkpoint_precision`` (``gguf-Q4_1``, ``gptq-int4``, ``bfloat16``
    ...) and the job's ``engine.quantization``, for where ``describe_model`` cannot run."""
    src = "checkpoint format"
    if job_quantization == "none":
        return EnginePath("none", None, "dense", src)
    if job_quantization in ONLINE:
        return EnginePath(
            job_quantization, job_quantization, f"{job_quantization}, quantized while loading", src
        )
    stored = checkpoint_precision or ""
    if stored.startswith("gguf"):
        kind = stored.removeprefix("gguf-")
        precision = GGUF_PACKED.get(kind)
        roomy = dense_bytes * DENSE_SHARE <= memory_bytes
        if precision is None or (job_quantization is None and on_cpu_float32 and roomy):
            return EnginePath("gguf", None, f"gguf {kind} dequantized, dense", src)
        return EnginePath("gguf", precision, f"gguf {kind}, packed", src)
    method = stored.split("-int")[0]
    for bits in ("4", "8"):
        if stored.endswith(f"-int{bits}"):
            return EnginePath(method, f"int{bits}", f"{stored}, packed", src)
    if "fp8" in stored:
        return EnginePath(method, "fp8", f"{stored}, packed", src)
    return EnginePath("none", None, "dense", src)


def engine_path(
    model: str,
    dtype: str,
    device: str,
    job_quantization: str | None,
    checkpoint_precision: str,
    dense_bytes: int,
    memory_bytes: int,
) -> EnginePath:
    """``describe_model(model, dtype, device, quantization)``'s path; without torch, the stored format's."""
    try:
        from prefixflow.pipeline.engine_access import describe_model

        return from_description(
            describe_model(model, dtype=dtype, device=device, quantization=job_quantization)
        )
    except ValueError:  # a model or quantization the engine refuses: loading says why; price it dense
        return DENSE
    except Exception:  # no torch here (ImportError), or a description that failed: the stored format's rules
        cpu32 = device == "cpu" and dtype == "float32"
        return from_checkpoint(checkpoint_precision, job_quantization, cpu32, dense_bytes, memory_bytes)


# GGUF block kinds the engine runs dense in bf16 on a CPU with native bf16 (engine/quantization/weight_path.py
# cpu_auto_dtype): their weights are 4-8-bit already
CPU_BF16_GGUF = frozenset({"Q8_0", "Q4_0", "Q4_1"})


def cpu_auto_dtype(model: str, checkpoint_precision: str, native_bf16: bool) -> str:
    """The dtype ``dtype: auto`` gives ``model`` on this CPU: ``describe_model``'s; without torch, the
    engine's rule from the stored format (bf16 for a GGUF file of Q8_0/Q4_0/Q4_1 blocks where the CPU
    multiplies bf16 natively, float32 otherwise)."""
    try:
        from prefixflow.pipeline.engine_access import describe_model

        return str(describe_model(model, dtype="auto", device="cpu")["dtype"])
    except ValueError:  # a model the engine refuses: loading says why; price it as float32
        return "float32"
    except Exception:  # no torch here (ImportError): the stored format's rule
        stored = checkpoint_precision or ""
        kind = stored.removeprefix("gguf-") if stored.startswith("gguf") else ""
        return "bfloat16" if native_bf16 and kind in CPU_BF16_GGUF else "float32"
