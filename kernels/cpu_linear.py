"""Dense linear layers on the CPU with the weight prepacked once into oneDNN's blocked layout.

Why: ``F.linear`` on a bf16 weight reorders it into oneDNN's layout on every call. At the small row
counts of offline decode (16-64 rows) that reorder is most of the call: prepacked once at load,
bf16 matmuls ran 1.6-3.8x faster at 16 rows on an AMX CPU (benchmarks/RESULTS.md "Issue 24"). The
math is the same matmul in the same dtype (products accumulated in float32, rounded once to bf16),
so results agree with ``reference_linear`` up to the summation order.

Where it applies (``linear_kernel``): bf16 activations on a CPU whose oneDNN has a bf16 reorder
(AVX512-BF16, AMX or AVX-NE-CONVERT; probed once with a tiny reorder, so a CPU without it, or a torch
built without oneDNN, falls back to ``F.linear`` and says why). Float32 keeps MKL's matmul:
measured on an AVX2 CPU, oneDNN-prepacked float32 was no faster (0.97-1.0x) and MKL's packed
GEMM helps only at the exact row count it was packed for.

``dense_linear`` (float32 on the CPU; anything else is ``F.linear``): a wide layer (``CHUNK_MIN_OUT`` outputs or more:
the fused gate|up projection, the LM head) multiplied at ``CHUNK_MIN_ROWS`` rows or more runs in
column chunks of ``CHUNK`` outputs written into one output. Why: on a 2-core Zen 3 (512 KiB L2) one
``F.linear`` over a 3072x576 float32 weight at 16 rows took 535 ns per output column against 330 for
a 576-wide one; in chunks of 768 the fused gate|up ran 1.14x and the 49152-wide LM head 1.27-1.29x
at 16-64 rows, bit-equal to ``F.linear`` (every output is the same dot product); at 1 row chunks were
slower (0.6-0.9x), hence the row floor (RESULTS.md "Issue 24", third round).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

PREPACKED = "onednn-prepacked"
PLAIN = "torch-linear"
ROWS_HINT = 16  # the row count oneDNN tunes the packed layout for (any row count runs)
CHUNK = 768
CHUNK_MIN_OUT = 2048
CHUNK_MIN_ROWS = 8


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


def dense_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``reference_linear`` bit for bit; wide float32 CPU layers at ``CHUNK_MIN_ROWS``+ rows in column chunks."""
    out_features = weight.shape[0]
    if (
        x.device.type != "cpu"
        or x.dtype != torch.float32
        or out_features < CHUNK_MIN_OUT
        or x.dim() != 2
        or x.shape[0] < CHUNK_MIN_ROWS
        or torch.is_grad_enabled()
    ):
        return F.linear(x, weight, bias)
    out = torch.empty(x.shape[0], out_features, dtype=x.dtype)
    for start in range(0, out_features, CHUNK):
        part = weight[start : start + CHUNK].t()
        if bias is None:
            torch.mm(x, part, out=out[:, start : start + CHUNK])
        else:
            torch.addmm(bias[start : start + CHUNK], x, part, out=out[:, start : start + CHUNK])
    return out
