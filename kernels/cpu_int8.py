"""int8 weights x int8 activations (w8a8) for CPU linear layers, through FBGEMM's int8 GEMM.

Why: on an AVX2 CPU both prefixflow and transformers spend ~77 % of a step in the same MKL float32
sgemm; FBGEMM's int8 GEMM (it ships with torch) ran 1.6-3x that at 5-64 rows and 2-9x on the
49152-wide LM head (benchmarks/RESULTS.md "Issue 24", w8a8). The engine takes it by default only
where the checkpoint is already quantized (engine/quantization/int8_path.py).

The math (``reference_int8_linear`` is the oracle, in plain torch):
- weight, per output channel ``n``: ``sw[n] = absmax(W[n]) / W_MAX``, ``Wq = round(W / sw)``;
- activations, per row ``m`` (never per tensor, so a row's result does not depend on the other rows
  of its batch): ``sa[m] = absmax(x[m]) / ACT_MAX``, ``xq = round(x / sa)`` in [-ACT_MAX, ACT_MAX];
- ``y[m, n] = (float(sum_k xq[m, k] Wq[n, k]) * sw[n]) * sa[m] + b[n]``.

The integer sums are exact, and every other step is elementwise, so a row's output is the same bits
whatever its batch (``batch_invariant`` holds without the padding). FBGEMM is handed ``x / sa`` with
fixed quantization parameters (scale 1, zero point ``ACT_MAX + 1``: u8 values in [1, 255]) and returns
``float(acc) * sw[n]``.

Bits: 8-bit activations, 7-bit weights (``W_MAX`` 64). On AVX2 FBGEMM multiplies u8 x s8 pairs into
saturating int16 (vpmaddubsw); 8-bit weights against 8-bit activations overflow there (measured: a
wrong sum), and 255 x 64 x 2 < 32767 cannot. Measured on the embedded SmolLM2's activations, 8-bit
activations with 7-bit weights gave half the error of 7-bit activations with 8-bit weights (the
activations have outlier channels: a row's absmax is 10-20x its RMS).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch

INT8 = "fbgemm-int8-w8a8"
ACT_MAX = 127
ZERO_POINT = ACT_MAX + 1
W_MAX = 64


@dataclass(frozen=True)
class Int8Weight:
    """A ``[out, in]`` weight quantized per output channel and prepacked for FBGEMM."""

    packed: Any  # torch.classes.quantized.LinearPackedParamsBase
    qweight: torch.Tensor  # int8 [out, in] (kept for the reference and the weight report)
    scales: torch.Tensor  # float32 [out]
    out_features: int
    in_features: int

    @property
    def nbytes(self) -> int:
        """Bytes held: the packed int8 weight (about the size of ``qweight``) and the scales."""
        return 2 * self.qweight.numel() + self.scales.numel() * 8


@contextlib.contextmanager
def _fbgemm() -> Iterator[None]:
    saved = torch.backends.quantized.engine
    torch.backends.quantized.engine = "fbgemm"
    try:
        yield
    finally:
        torch.backends.quantized.engine = saved


def quantize_weight(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 ``Wq``, float32 ``sw``): symmetric per-output-channel quantization of a 2-D weight."""
    w = weight.detach().float()
    absmax = w.abs().amax(dim=1)
    scales = torch.where(absmax > 0, absmax / W_MAX, torch.ones_like(absmax))
    q = torch.clamp(torch.round(w / scales[:, None]), -W_MAX, W_MAX).to(torch.int8)
    return q, scales


def pack_int8(weight: torch.Tensor) -> Int8Weight:
    """``weight`` ``[out, in]`` (any float dtype, CPU) quantized and prepacked (where ``int8_unsupported`` is None)."""
    if weight.dim() != 2 or weight.device.type != "cpu":
        raise ValueError(f"pack_int8 takes a 2-D CPU weight, not {tuple(weight.shape)} on {weight.device}")
    q, scales = quantize_weight(weight)
    out_features, in_features = q.shape
    zeros = torch.zeros(out_features, dtype=torch.long)
    with _fbgemm(), warnings.catch_warnings():
        # torch deprecates quantized tensor types; where they are gone, the probe falls back to float32
        warnings.filterwarnings("ignore", message=".*quantized tensor creation.*", category=UserWarning)
        qw = torch._make_per_channel_quantized_tensor(q, scales.double(), zeros, 0)
        packed = torch.ops.quantized.linear_prepack(qw, None)
    return Int8Weight(packed, q, scales, out_features, in_features)


def row_scales(rows: torch.Tensor) -> torch.Tensor:
    """``sa`` ``[m, 1]``: each row's absmax / ACT_MAX (an all-zero row gets a harmless tiny scale)."""
    return rows.abs().amax(dim=1, keepdim=True).clamp_min(1e-30) / ACT_MAX


def int8_linear(x: torch.Tensor, w: Int8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x W^T + b`` in w8a8 (module doc), computed in float32, returned in ``x``'s dtype and shape."""
    if x.shape[-1] != w.in_features:
        raise ValueError(f"input has {x.shape[-1]} features, the layer takes {w.in_features}")
    rows = x.reshape(-1, w.in_features).float()
    sa = row_scales(rows)
    out = torch.ops.quantized.linear_with_input_q_dq_qweight_dq_output_fp32(
        rows / sa, 1.0, ZERO_POINT, w.packed
    )
    out.mul_(sa)
    if bias is not None:
        out.add_(bias)
    return out.reshape(*x.shape[:-1], w.out_features).to(x.dtype)


def reference_int8_linear(
    x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The oracle of ``int8_linear`` in plain torch: the same quantization, integer sums in int64."""
    rows = x.reshape(-1, x.shape[-1]).float()
    sa = row_scales(rows)
    xq = torch.clamp(torch.round(rows / sa), -ACT_MAX, ACT_MAX).to(torch.int64)
    acc = xq @ qweight.to(torch.int64).t()
    out = (acc.float() * scales) * sa
    if bias is not None:
        out = out + bias
    return out.reshape(*x.shape[:-1], qweight.shape[0])


@functools.cache
def int8_unsupported() -> str | None:
    """None when FBGEMM's int8 GEMM runs here (probed once, checked against the reference), else why not."""
    if "fbgemm" not in torch.backends.quantized.supported_engines:
        return "this torch has no FBGEMM quantized engine"
    try:
        g = torch.Generator().manual_seed(0)
        weight = torch.randn(24, 64, generator=g)
        x = torch.randn(3, 64, generator=g) * 4
        w = pack_int8(weight)
        got = int8_linear(x, w)
    except (RuntimeError, AttributeError, NotImplementedError) as exc:
        return f"FBGEMM's int8 linear does not run here ({str(exc).splitlines()[0][:120]})"
    if not torch.equal(got, reference_int8_linear(x, w.qweight, w.scales)):
        return "FBGEMM's int8 linear disagreed with its reference in the load-time probe"
    return None
