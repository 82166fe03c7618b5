"""Which weight path the engine will run for the job's model, as ``describe_model`` reports it, from the
job's ``quantization`` setting and the checkpoint's stored format (no weights read, no torch).

The engine keeps the quantized formats it supports packed (GPTQ, AWQ, GGUF Q8_0/Q4_0/Q4_1), quantizes a
full-precision checkpoint when the job says ``quantization: int8|int4|fp8``, and runs everything dense
with ``quantization: none`` (docs/models.md "Quantized models"). The estimate must price that path, not
dense weights: on the CPU in float32 a packed path is 1.7-5.2x slower per layer than the dense matmul
(benchmarks/RESULTS.md "Quantized weights on the CPU": torch has no fast float32 int4/int8 kernels), so
a dense-float32 prediction of a Q4_1 GGUF run was 4.5x too fast (issue 31).
"""

from __future__ import annotations

from dataclasses import dataclass

GGUF_PACKED = {"Q4_0": "int4", "Q4_1": "int4", "Q8_0": "int8"}  # block types the engine keeps packed
ONLINE = ("int8", "int4", "fp8")
CPU_FLOAT32_PACKED_SLOWDOWN = (1.7, 5.2)  # per layer, packed quantized vs dense float32 (RESULTS.md)


@dataclass(frozen=True)
class EnginePath:
    method: str  # describe_model's quantization method: none, gguf, gptq, awq, compressed-tensors, int8 ...
    precision: str | None  # the advisor's precision class of the packed linear layers; None: dense
    label: str  # what the report shows, e.g. "gguf Q4_1, packed"

    @property
    def packed(self) -> bool:
        return self.precision is not None


DENSE = EnginePath("none", None, "dense")


def engine_path(checkpoint_precision: str, job_quantization: str | None) -> EnginePath:
    """``checkpoint_precision`` is ``ModelCard.checkpoint_precision`` (``gguf-Q4_1``, ``gptq-int4``,
    ``bfloat16`` ...); ``job_quantization`` the job's ``engine.quantization``."""
    if job_quantization == "none":
        return DENSE
    if job_quantization in ONLINE:
        return EnginePath(job_quantization, job_quantization, f"{job_quantization}, quantized while loading")
    stored = checkpoint_precision or ""
    if stored.startswith("gguf"):
        kind = stored.removeprefix("gguf-")
        precision = GGUF_PACKED.get(kind)
        return EnginePath("gguf", precision, f"gguf {kind}, packed") if precision else EnginePath("gguf", None, f"gguf {kind}, dequantized")
    method = stored.split("-int")[0]
    if stored.endswith("-int4"):
        return EnginePath(method, "int4", f"{stored}, packed")
    if stored.endswith("-int8"):
        return EnginePath(method, "int8", f"{stored}, packed")
    if "fp8" in stored:
        return EnginePath(method, "fp8", f"{stored}, packed")
    return DENSE
