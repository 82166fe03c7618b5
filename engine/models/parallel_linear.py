"""Column- and row-parallel linear layers: the only two ways a decoder's projections split.

Column-parallel (q|k|v, gate|up): each rank computes a slice of the outputs; no communication.
Row-parallel (o_proj, down_proj): each rank multiplies its slice of the inputs (exactly the slice the
preceding column-parallel layer produced), one all-reduce sums the partial products, and the bias is
added once, after the sum. With one rank both are plain ``Linear`` layers.

Each checkpoint tensor arrives whole and is cut to this rank's part (``LinearShard.narrow``) before
the layer's ``LinearMethod`` stores it.
"""

from __future__ import annotations

import torch

from prefixflow.engine.distributed.group import ParallelGroup
from prefixflow.engine.distributed.linear_shard import LinearShard
from prefixflow.engine.distributed.sharding import Partition
from prefixflow.engine.models.linear import Linear, LinearMethod

# (output_dim, input_dim) of the dense checkpoint tensors: weight [out, in], bias [out]
_DENSE_DIMS = {"weight": (0, 1), "bias": (0, None)}


class ColumnParallelLinear(Linear):
    """Holds this rank's slice ``outputs[i]`` of every merged output shard ``i``."""

    def __init__(
        self,
        in_features: int,
        outputs: list[Partition],
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        method: LinearMethod | None = None,
    ) -> None:
        super().__init__(in_features, [p.size for p in outputs], bias=bias, dtype=dtype, method=method)
        self.shard = LinearShard(outputs=tuple(outputs))

    def load(self, param: str, tensor: torch.Tensor, shard: int = 0) -> None:
        out_dim, in_dim = _DENSE_DIMS[param]
        super().load(param, self.shard.narrow(tensor, shard, out_dim, in_dim, where=param), shard)


class RowParallelLinear(Linear):
    """Holds this rank's slice ``input`` of the inputs; ``forward`` returns the all-reduced full output."""

    def __init__(
        self,
        input: Partition,
        out_features: int,
        group: ParallelGroup,
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        method: LinearMethod | None = None,
    ) -> None:
        super().__init__(input.size, out_features, bias=bias, dtype=dtype, method=method)
        self.shard = LinearShard(input=input)
        self.group = group

    def load(self, param: str, tensor: torch.Tensor, shard: int = 0) -> None:
        out_dim, in_dim = _DENSE_DIMS[param]  # the bias has no input axis: every rank keeps it whole
        super().load(param, self.shard.narrow(tensor, shard, out_dim, in_dim, where=param), shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.group.all_reduce(self.method.apply(self, x, None))
        return out if self.bias is None else out + self.bias

