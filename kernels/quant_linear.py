"""Pick the kernel that runs a quantized linear layer on a device: the one entry point the engine uses.

- weight-only int4/int8 (``PackedWeight``): the Triton dequant-GEMM on CUDA (or on the CPU under the
  Triton interpreter when the ``triton`` backend is forced), else the CPU kernels of ``quant_cpu``;
- fp8 W8A8 (``Fp8Weight``): ``torch._scaled_mm`` where the device supports it, else the reference.

Every kernel object is called as ``kernel(x, bias)`` and lists the tensors it holds in ``tensors()``
(what the layer keeps in memory), and has a ``name`` for reports.
"""

from __future__ import annotations

import torch

from prefixflow.kernels.fp8_linear import (
    Fp8Weight,
    fp8_linear_reference,
    fp8_linear_scaled_mm,
    scaled_mm_supported,
)
from prefixflow.kernels.quant_cpu import CpuKernel, select_cpu_kernel
from prefixflow.kernels.quant_weight import PackedWeight


class TritonWeightOnly:
    """``triton_quant_gemm.quant_linear`` over the canonical ``PackedWeight`` (no repacking)."""

    def __init__(self, w: PackedWeight) -> None:
        from prefixflow.kernels import triton_quant_gemm

        self.w = w
        self._gemm = triton_quant_gemm.quant_linear
        self.name = f"triton-w{w.bits}a16"

    def tensors(self) -> dict[str, torch.Tensor]:
        return self.w.tensors()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return self._gemm(x, self.w, bias)


class Fp8Kernel:
    def __init__(self, w: Fp8Weight, device: torch.device) -> None:
        self.w = w
        self.scaled_mm = scaled_mm_supported(w, device)
        self.name = "fp8-scaled-mm" if self.scaled_mm else "fp8-reference"

    def tensors(self) -> dict[str, torch.Tensor]:
        return self.w.tensors()

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        if self.scaled_mm:
            return fp8_linear_scaled_mm(x, self.w, bias)
        return fp8_linear_reference(x, self.w, bias)


QuantKernel = TritonWeightOnly | CpuKernel | Fp8Kernel


def weight_only_kernel(
    w: PackedWeight, dtype: torch.dtype, device: torch.device, backend: str = "auto"
) -> TritonWeightOnly | CpuKernel:
    """``backend``: the engine's kernel backend name ("triton" or "torch"; "auto" = Triton on CUDA)."""
    use_triton = backend == "triton" or (backend == "auto" and device.type == "cuda")
    if use_triton:
        from prefixflow.kernels.backend import triton_available

        if triton_available():
            return TritonWeightOnly(w)
    return select_cpu_kernel(w, dtype)


def fp8_kernel(w: Fp8Weight, device: torch.device) -> Fp8Kernel:
    return Fp8Kernel(w, device)
