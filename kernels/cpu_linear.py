"""Dense linear layers on the CPU with the weight prepacked once into oneDNN's blocked layout.

Why: ``F.linear`` on a bf16 weight reorders it into oneDNN's layout on every call. At the small row
counts of offline decode (16-64 rows) that reorder is most of the call: prepacked once at load,
bf16 matmuls ran 1.6-3.8x faster at 16 rows on an AMX CPU (benchmarks/RESULTS.md "Issue 24"). The
math is the same matmul in the same dtype (products accumulated in float32, rounded once to bf16),
so results agree with ``reference_linear`` up to the summation order.

Where it applies (``linear_kernel``): bf16 activations on a CPU whose oneDNN has a bf16 reorder
(AVX512-BF16, AMX or AVX-NE-CONVERT; probed once with a tiny reorder, so a CPU without it, or a torch
built without oneDNN, falls back to ``F.linear`` and says why). Float32 keeps ``F.linear`` (MKL):
measured on an AVX2 CPU, oneDNN-prepacked float32 was no faster (0.97-1.0x) and MKL's packed
GEMM helps only at the exact row count it was packed for.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PREPACKED = "onednn-prepacked"
PLAIN = "torch-linear"
ROWS_HINT = 16  # the row count oneDNN tunes the packed layout for (any row count runs)


@dataclass(frozen=True)
class LinearKernel:
    """Which dense CPU matmul a model's linear layers take, and why (``describe_model`` reports it)."""

    kernel: str
    reason: str

    def describe(self) -> dict[str, str]:
        return {"kernel": self.kernel, "reason": self.reason}


@dataclass(frozen=True)
class PrepackedWeight:
    """A ``[out, in]`` weight in oneDNN's layout; ``nbytes`` is what it holds (for the weight report)."""

    packed: torch.Tensor
    out_features: int
    in_features: int
    dtype: torch.dtype
    nbytes: int


def reference_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The oracle: ``x W^T + b``."""
    return F.linear(x, weight, bias)


@functools.cache
def prepack_unsupported(dtype: torch.dtype) -> str | None:
    """None when oneDNN can prepack ``dtype`` weights on this CPU, else why not (probed once per dtype)."""
    if dtype != torch.bfloat16:
        return f"{str(dtype).removeprefix('torch.')}: only bf16 weights are prepacked"
    if not torch.backends.mkldnn.is_available():
        return "this torch is built without oneDNN"
    try:
        w = torch.ones(8, 16, dtype=dtype)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, 2)
        out = torch.ops.mkldnn._linear_pointwise(torch.ones(2, 16, dtype=dtype), packed, None, "none", [], "")
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        return f"oneDNN cannot reorder bf16 weights here ({str(exc).splitlines()[0][:120]})"
    if not bool((out == 16).all()):
        return "oneDNN's prepacked bf16 matmul gave a wrong result in the probe"
    return None


def linear_kernel(device: str, dtype: str) -> LinearKernel | None:
    """The dense matmul the CPU's linear layers take in ``dtype`` (None off the CPU)."""
    if device != "cpu":
        return None
    if dtype == "float32":
        return LinearKernel(
            PLAIN,
            "float32: torch's MKL matmul (oneDNN prepacking measured no faster on AVX2, RESULTS.md 'Issue 24')",
        )
    unsupported = prepack_unsupported(getattr(torch, dtype))
    if unsupported is not None:
        return LinearKernel(PLAIN, unsupported)
    return LinearKernel(
        PREPACKED,
        f"{dtype}: weights prepacked once into oneDNN's layout (F.linear reorders them every call; "
        "1.6-3.8x at 16 rows on AMX, RESULTS.md 'Issue 24')",
    )


def prepack(weight: torch.Tensor, rows_hint: int = ROWS_HINT) -> PrepackedWeight:
    """``weight`` ``[out, in]`` reordered for oneDNN (call only where ``prepack_unsupported`` is None)."""
    if weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"prepack takes a 2-D CPU weight, not {tuple(weight.shape)} on {weight.device}")
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous(), rows_hint)
    out_features, in_features = weight.shape
    return PrepackedWeight(
        packed, out_features, in_features, weight.dtype, weight.numel() * weight.element_size()
    )


def prepacked_linear(x: torch.Tensor, w: PrepackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    """``reference_linear(x, weight, bias)`` with ``w = prepack(weight)``; ``x`` of any leading shape."""
    if x.shape[-1] != w.in_features:
        raise ValueError(f"input has {x.shape[-1]} features, the layer takes {w.in_features}")
    rows = x.reshape(-1, w.in_features)
    out = torch.ops.mkldnn._linear_pointwise(rows.contiguous(), w.packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], w.out_features)
