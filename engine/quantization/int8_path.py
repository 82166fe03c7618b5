"""Whether a CPU model's dense linear layers run in int8 (w8a8, kernels/cpu_int8.py) or float32.

Why a rule and not always: w8a8 changes the numerics (7-bit per-row activations, 8-bit per-channel
weights), so it is taken by default only where the user already accepted quantization error: a
checkpoint whose weights are quantized blocks (a GGUF file's Q8_0/Q4_0/Q4_1 layers, dequantized at
load for the CPU; llama.cpp itself multiplies those against 8-bit activations). Dense
fp32/fp16/bf16 checkpoints stay exact by default. ``EngineConfig.cpu_int8`` forces it either way:

- ``"off"``: float32 matmuls (kernels/cpu_linear.py);
- ``"on"``: int8 for every dense linear layer, the LM head included, in any activation dtype;
- ``"auto"`` (default): float32 for now (``AUTO_INT8``: the measured quality gap is too large for a
  silent default). The rule it switches on: int8 on the CPU, float32 activations, for a GGUF file
  whose blocks run dense (``weight_path`` dense), where FBGEMM runs (probed once).

The choice decides outputs, so ``identity_of`` digests it (``w8a8``): a resumed job cannot mix paths.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prefixflow.kernels.cpu_int8 import ACT_MAX, INT8, int8_unsupported

# Whether "auto" takes int8 for a quantized checkpoint. Off: on the embedded SmolLM2 (Q4_1) int8
# moved the next-token top-1 at 16-18 % of positions and greedy outputs diverged within a few tokens
# (RESULTS.md "Issue 24", w8a8), more than a default may change silently; cpu_int8="on" takes it.
AUTO_INT8 = False
# The tied LM head stays float32: in int8 it alone moved the next-token top-1 of 8 % of positions on
# the embedded SmolLM2 (RESULTS.md "Issue 24", w8a8); logits decide labels and extraction.
INT8_LM_HEAD = False
WHY_FASTER = "FBGEMM's int8 GEMM ran 1.6-3x the float32 sgemm at 5-64 rows (RESULTS.md 'Issue 24', w8a8)"


@dataclass(frozen=True)
class Int8Choice:
    """Whether the dense layers (and the LM head) take the int8 path, and why."""

    int8: bool
    reason: str
    lm_head: bool = False  # the tied LM head in int8 too (INT8_LM_HEAD)

    def linear_kernel(self) -> dict[str, str]:
        return {"kernel": INT8, "reason": self.reason}

    def digest_entry(self) -> dict[str, Any]:
        """What enters the model digest when int8 is taken (the quantization scheme, not the reason)."""
        return {
            "kernel": INT8,
            "activations": f"int8 per row, absmax/{ACT_MAX}",
            "weights": "int8 per output channel, absmax/127",
            "lm_head": "int8" if self.lm_head else "float32",
        }


class Int8Unavailable(ValueError):
    """``cpu_int8="on"`` where the int8 path cannot run; the message says what to change."""


def choose_cpu_int8(
    requested: str, device: str, dtype: str, weight_path: dict[str, Any] | None, method: str | None
) -> Int8Choice:
    """The choice for a model on ``device`` in ``dtype``; ``weight_path``: the GGUF file's path
    (``WeightPath.describe()``, None for other formats); ``method``: the quantization method name."""
    if requested == "off":
        return Int8Choice(False, "cpu_int8='off': float32 matmuls")
    if device != "cpu":
        if requested == "on":
            raise Int8Unavailable(f"cpu_int8='on' runs on the CPU only (this model runs on {device})")
        return Int8Choice(False, f"{device}: the int8 path is for CPU devices")
    unsupported = int8_unsupported()
    if unsupported is not None:
        if requested == "on":
            raise Int8Unavailable(f"cpu_int8='on' cannot run here: {unsupported}; use 'auto' or 'off'")
        return Int8Choice(False, f"int8 unavailable ({unsupported})")
    if requested == "on":
        return Int8Choice(
            True, f"cpu_int8='on': int8 weights x int8 per-row activations; {WHY_FASTER}", INT8_LM_HEAD
        )
    blocks = weight_path is not None and weight_path.get("path") == "dense"
    if not blocks:
        why = (
            "the GGUF blocks stay packed (their own kernel)"
            if weight_path is not None
            else f"{method or 'dense'} checkpoint: exact float32 matmuls by default (cpu_int8='on' for int8)"
        )
        return Int8Choice(False, why)
    if dtype != "float32":
        return Int8Choice(False, f"{dtype} activations: int8 is taken by default for float32 only")
    if not AUTO_INT8:
        return Int8Choice(
            False,
            "not by default: int8 moved the next-token top-1 at 16-18 % of positions of the embedded "
            "SmolLM2 (RESULTS.md 'Issue 24', w8a8); cpu_int8='on' takes it (faster, less exact)",
        )
    return Int8Choice(
        True,
        "quantized checkpoint (GGUF blocks, dequantized at load): int8 weights x int8 per-row activations "
        f"by default on the CPU; {WHY_FASTER}; cpu_int8='off' for float32 matmuls",
        INT8_LM_HEAD,
    )
