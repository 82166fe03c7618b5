"""How a checkpoint tensor of a linear layer is cut down to one rank's part.

A layer is column-parallel (each rank owns a slice of every merged output shard: q|k|v, gate|up) or
row-parallel (each rank owns a slice of the inputs). Which axis of a stored tensor is the output or
the input axis, and how many logical elements one stored element covers (GPTQ packs 8 inputs per
int32, group scales cover ``group_size`` inputs, AWQ packs 8 outputs), is the format's business: the
caller says it, this module only cuts, and refuses a cut that would split a packed word or a group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from prefixflow.engine.distributed.sharding import Partition, ShardingError


@dataclass(frozen=True)
class LinearShard:
    """One rank's part of a (possibly merged) linear layer's global weight.

    ``outputs[i]``: the slice of merged shard ``i``'s outputs this rank holds (column-parallel), or None
    when the outputs are whole. ``input``: the slice of the inputs (row-parallel), or None.
    """

    outputs: tuple[Partition, ...] | None = None
    input: Partition | None = None

    def out_sizes(self, global_sizes: list[int]) -> list[int]:
        return list(global_sizes) if self.outputs is None else [p.size for p in self.outputs]

    def narrow(
        self,
        tensor: torch.Tensor,
        shard: int,
        output_dim: int | None,
        input_dim: int | None,
        output_pack: int = 1,
        input_pack: int = 1,
        where: str = "tensor",
    ) -> torch.Tensor:
        """This rank's part of a checkpoint ``tensor`` belonging to merged shard ``shard``."""
        if self.outputs is not None and output_dim is not None:
            tensor = _cut(tensor, output_dim, self.outputs[shard], output_pack, where, "outputs")
        if self.input is not None and input_dim is not None:
            tensor = _cut(tensor, input_dim, self.input, input_pack, where, "inputs")
        return tensor


WHOLE = LinearShard()


def _cut(tensor: torch.Tensor, dim: int, part: Partition, pack: int, where: str, what: str) -> torch.Tensor:
    """The stored elements covering ``part``; the last part may end in a partial unit (a last group
    shorter than the others, a last word only partly filled). A whole dimension is not cut (the
    layer's own load then checks its shape)."""
    if part.start == 0 and part.end == part.total:
        return tensor
    ends_whole = part.size % pack == 0 or part.end == part.total
    if part.start % pack or not ends_whole:
        raise ShardingError(
            f"{where}: this rank's {part.size} {what} at offset {part.start} do not fall on whole "
            f"{pack}-element units of the stored tensor (a packed word or a quantization group), so "
            f"tensor parallelism cannot split this layer at this size; use a smaller "
            f"tensor_parallel_size or a checkpoint with a smaller group size"
        )
    stored = -(-part.total // pack)
    if tensor.shape[dim] != stored:
        raise ShardingError(
            f"{where}: dimension {dim} has {tensor.shape[dim]} stored elements, expected {stored} "
            f"for {part.total} {what}"
        )
    first = part.start // pack
    return tensor.narrow(dim, first, -(-part.end // pack) - first)
