"""FP8 W8A8 linear layers: e4m3 weights with per-output-channel scales, activations quantized per token.

``fp8_linear_scaled_mm`` is the GPU path (``torch._scaled_mm``, Hopper and newer, rowwise scales).
``fp8_linear_reference`` is the CPU path and the oracle: it performs the same two roundings (weights
stored in e4m3, each activation row rounded to e4m3 at ``amax / 448``) and multiplies in float32. On
the CPU torch's float8 conversions run at about 20 ns per element, so weights are widened by a bit
shift into float16 instead (exact: every e4m3 value is a float16 value times 2**-8), a few hundred
rows at a time.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True)
class Fp8Weight:
    """``weight`` e4m3 ``[N, K]``, ``scale`` float32 ``[N]``: w = weight * scale[:, None].

    ``input_scale`` (float32 scalar tensor) is a static activation scale; None quantizes activations
    dynamically, per token. Column-parallel TP splits N (rows of both), row-parallel splits K.
    """

    weight: torch.Tensor
    scale: torch.Tensor
    input_scale: torch.Tensor | None = None

    def __post_init__(self) -> None:
        if self.weight.dtype != FP8 or self.weight.dim() != 2:
            raise ValueError(
                f"fp8 weight must be float8_e4m3fn [N, K], got {self.weight.dtype} {tuple(self.weight.shape)}"
            )
        if tuple(self.scale.shape) != (self.weight.shape[0],) or self.scale.dtype != torch.float32:
            raise ValueError(
                f"fp8 weight scale must be float32 [{self.weight.shape[0]}], got {self.scale.dtype} {tuple(self.scale.shape)}"
            )

    def tensors(self) -> dict[str, torch.Tensor]:
        named = {"weight": self.weight, "scale": self.scale, "input_scale": self.input_scale}
        return {k: v for k, v in named.items() if v is not None}


def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``x [M, K]`` to e4m3 with its own scale ``amax / 448`` (float32 ``[M, 1]``)."""
    xf = x.float()
    scale = (xf.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (xf / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8), scale


def quantize_fp8_static(x: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` to e4m3 at one given scale; returns the scale broadcast to ``[M, 1]``."""
    s = scale.float().reshape(1, 1).expand(x.shape[0], 1)
    return (x.float() / s).clamp(-FP8_MAX, FP8_MAX).to(FP8), s


def widen_fp8(codes: torch.Tensor) -> torch.Tensor:
    """e4m3 bit patterns (uint8) -> float16 values 2**-8 times the e4m3 values (exact, NaN excluded)."""
    x = codes.to(torch.int16)
    return (((x & 0x80) << 8) | ((x & 0x7F) << 7)).view(torch.float16)


def _quantize_input(x2: torch.Tensor, w: Fp8Weight) -> tuple[torch.Tensor, torch.Tensor]:
    return quantize_fp8_rows(x2) if w.input_scale is None else quantize_fp8_static(x2, w.input_scale)


def fp8_linear_reference(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """W8A8 numerics in float32: rows of x rounded to e4m3, times the e4m3 weights, scaled; ``x.dtype`` out."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, sx = _quantize_input(x2, w)
    xd = widen_fp8(xq.view(torch.uint8)).float() * (sx * 256.0)
    n, k = w.weight.shape
    out = torch.empty(x2.shape[0], n, dtype=torch.float32, device=x.device)
    rows = max(16, _CHUNK_BYTES // (4 * k))
    codes = w.weight.view(torch.uint8)
    for start in range(0, n, rows):
        stop = min(n, start + rows)
        dense = widen_fp8(codes[start:stop]).float() * (w.scale[start:stop, None] * 256.0)
        torch.mm(xd, dense.t(), out=out[:, start:stop])
    if bias is not None:
        out += bias.float()
    return out.to(x.dtype).reshape(*x.shape[:-1], n)


def scaled_mm_supported(w: Fp8Weight, device: torch.device) -> bool:
    """``torch._scaled_mm`` needs a CUDA device of compute capability >= 8.9 and K, N multiples of 16."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device) < (8, 9):
        return False
    n, k = w.weight.shape
    return n % 16 == 0 and k % 16 == 0


def fp8_linear_scaled_mm(x: torch.Tensor, w: Fp8Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The GPU path: per-token e4m3 activations x e4m3 weights in ``torch._scaled_mm`` (bfloat16 out)."""
    x2 = x.reshape(-1, x.shape[-1])
    xq, sx = _quantize_input(x2, w)
    out = torch._scaled_mm(xq, w.weight.t(), scale_a=sx, scale_b=w.scale[None, :], out_dtype=torch.bfloat16)
    if bias is not None:
        out = out + bias.to(out.dtype)
    return out.to(x.dtype).reshape(*x.shape[:-1], out.shape[-1])
