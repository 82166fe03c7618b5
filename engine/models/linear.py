"""Linear layers whose weight storage and matmul are delegated to a ``LinearMethod``.

Why: quantized formats (int8/int4/GPTQ/AWQ/fp8) and tensor-parallel sharding change how weights are
stored and multiplied, not the model's structure. A new method plugs in here; the model is untouched.
Merged projections (q|k|v, gate|up) load each checkpoint tensor into its slice by ``shard``.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import nn


class LinearMethod:
    """Creates a layer's parameters and applies it. The default keeps a dense weight."""

    def create_weights(
        self, layer: nn.Module, in_features: int, out_features: int, dtype: torch.dtype
    ) -> None:
        layer.weight = nn.Parameter(torch.empty(out_features, in_features, dtype=dtype), requires_grad=False)

    def load_shard(self, layer: nn.Module, name: str, tensor: torch.Tensor, row_offset: int) -> None:
        target = getattr(layer, name)
        rows = tensor.shape[0]
        if target.shape[1:] != tensor.shape[1:] or row_offset + rows > target.shape[0]:
            raise ValueError(
                f"shape mismatch loading {name}: {tuple(tensor.shape)} into {tuple(target.shape)}"
            )
        target.data[row_offset : row_offset + rows].copy_(tensor)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return nn.functional.linear(x, cast(torch.Tensor, layer.weight), bias)


class Linear(nn.Module):
    """``y = x W^T + b`` whose output rows are the concatenation of ``out_sizes`` shards."""

    def __init__(
        self,
        in_features: int,
        out_sizes: list[int] | int,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        method: LinearMethod | None = None,
    ) -> None:
        super().__init__()
        self.out_sizes = [out_sizes] if isinstance(out_sizes, int) else list(out_sizes)
        self.in_features = in_features
        self.out_features = sum(self.out_sizes)
        self.method = method or LinearMethod()
        self.method.create_weights(self, in_features, self.out_features, dtype)
        self.bias = (
            nn.Parameter(torch.empty(self.out_features, dtype=dtype), requires_grad=False) if bias else None
        )

    def load(self, param: str, tensor: torch.Tensor, shard: int = 0) -> None:
        """Copy a checkpoint tensor (``weight`` or ``bias``) into output shard ``shard``."""
        offset = sum(self.out_sizes[:shard])
        if tensor.shape[0] != self.out_sizes[shard]:
            raise ValueError(
                f"{param} shard {shard} has {tensor.shape[0]} rows, expected {self.out_sizes[shard]}"
            )
        self.method.load_shard(self, param, tensor, offset)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.apply(self, x, self.bias)
