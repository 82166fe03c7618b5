"""RMSNorm as a module holding its weight; the math lives in the selected kernels backend."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.ops = None  # set by the model runner to the chosen kernels backend

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        from prefixflow import kernels
        ops = self.ops or kernels
        return ops.rms_norm(x, self.weight, self.eps, residual)
