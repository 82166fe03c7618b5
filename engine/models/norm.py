"""RMSNorm as a module holding its weight; the math lives in the kernels backend it is built with."""

from __future__ import annotations

import torch
from torch import nn

from prefixflow.kernels import KernelBackend


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float, dtype: torch.dtype, ops: KernelBackend) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(size, dtype=dtype), requires_grad=False)
        self.ops = ops

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return self.ops.rms_norm(x, self.weight, self.eps, residual)
