"""Column- and row-parallel linear layers: the only two ways a decoder's projections split.

Column-parallel (q|k|v, gate|up): each rank computes a slice of the outputs; no communication.
Row-parallel (o_proj, down_proj): each rank multiplies its slice of the inputs (exactly the slice the
preceding column-parallel layer produced), one all-reduce sums the partial products, and the bias is
added once, after the sum. With one rank both are plain ``Linear`` layers.

Each checkpoint tensor arrives whole and is cut to this rank's part (``LinearShard.narrow``) before
the layer's ``LinearMethod`` stores it; the method says which axis of each of its checkpoint tensors
is the output and which the input, and how many logical elements a stored one covers (packed words,
quantization groups), so quantized formats split the same way.
"""

from __future__ import annotations

import torch

from prefixflow.engine.distributed.group import ParallelGroup
from prefixflow.engine.distributed.linear_shard import LinearShard
from prefixflow.engine.distributed.sharding import Partition
from prefixflow.engine.models.linear import Linear, LinearMethod, invariant_rows

_BIAS = (0, None, 1, 1)  # (output_dim, input_dim, output_pack, input_pack) of a bias: dense, [out]


def _narrow(
    layer: Linear, shard_info: LinearShard, param: str, tensor: torch.Tensor, shard: int
) -> torch.Tensor:
    out_dim, in_dim, out_pack, in_pack = (
        _BIAS if param == "bias" else layer.method.checkpoint_layout(param, shard)
    )
    where = f"{layer.prefixes[shard] if shard < len(layer.prefixes) else layer.prefixes[0]}.{param}"
    return shard_info.narrow(tensor, shard, out_dim, in_dim, out_pack, in_pack, where=where)


class ColumnParallelLinear(Linear):
    """Holds this rank's slice ``outputs[i]`` of every merged output shard ``i``."""

    def __init__(
        self,
        in_features: int,
        outputs: list[Partition],
        bias: bool = False,
        dtype: torch.dtype = torch.float32,
        method: LinearMethod | None = None,
        prefixes: list[str] | None = None,
    ) -> None:
        super().__init__(
            in_features,
            [p.size for p in outputs],
            bias=bias,
            dtype=dtype,
            method=method,
            prefixes=prefixes or (),
            full_sizes=(in_features, [p.total for p in outputs]),
        )
        self.shard = LinearShard(outputs=tuple(outputs))

    def load(self, param: str, tensor: torch.Tensor, shard: int = 0) -> None:
        super().load(param, _narrow(self, self.shard, param, tensor, shard), shard)


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
        prefixes: list[str] | None = None,
    ) -> None:
        super().__init__(
            input.size,
            out_features,
            bias=bias,
            dtype=dtype,
            method=method,
            prefixes=prefixes or (),
            full_sizes=(input.total, [out_features]),
        )
        self.shard = LinearShard(input=input)
        self.group = group

    def load(self, param: str, tensor: torch.Tensor, shard: int = 0) -> None:
        # the bias has no input axis: every rank keeps it whole
        super().load(param, _narrow(self, self.shard, param, tensor, shard), shard)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.group.all_reduce(
            invariant_rows(lambda rows: self.method.apply(self, rows, None), x, self.min_rows)
        )
        return out if self.bias is None else out + self.bias
