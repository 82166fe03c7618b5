"""Checkpoint tensors of one linear layer, described by which axis is which, and loaded shard by shard.

A merged layer (q|k|v, gate|up) is filled from one checkpoint tensor per shard. Each tensor's axes
are declared explicitly, so loading (and, later, tensor parallelism) can cut any format the same way:
- ``output_dim``: the axis along which shards concatenate and column-parallel ranks split; one stored
  element covers ``output_pack`` logical outputs (AWQ packs 8 outputs per int32 along it);
- ``input_dim``: the axis row-parallel ranks split; one stored element covers ``input_pack`` inputs
  (GPTQ packs 8 inputs per int32; group scales cover ``group_size`` inputs);
- ``output_dim=None``: one tensor shared by every shard (``g_idx``), which must then agree.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn


class CheckpointError(ValueError):
    """A checkpoint tensor is missing, unexpected, or does not fit the layer it belongs to."""


@dataclass(frozen=True)
class ParamSpec:
    name: str
    shape: tuple[int, ...]  # of the merged tensor
    dtype: torch.dtype
    output_dim: int | None
    input_dim: int | None
    output_pack: int = 1
    input_pack: int = 1
    optional: bool = False
    exact_dtype: bool = True  # integer / fp8 codes must arrive in their own dtype; float scales may be cast


def allocate(layer: nn.Module, spec: ParamSpec) -> None:
    """A zeroed buffer for ``spec`` on the layer (buffers: counted in weight bytes, moved with the layer)."""
    layer.register_buffer(spec.name, torch.zeros(spec.shape, dtype=spec.dtype), persistent=False)


def buffer(layer: nn.Module, name: str) -> torch.Tensor:
    value = getattr(layer, name)
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} of {type(layer).__name__} is not a tensor")
    return value


def load_shard(
    layer: nn.Module,
    spec: ParamSpec,
    tensor: torch.Tensor,
    shard: int,
    out_sizes: Sequence[int],
    where: str,
    seen: set[tuple[str, int]],
) -> None:
    """Copy one checkpoint tensor of shard ``shard`` into its slice of the merged buffer ``spec.name``.

    ``where`` names the checkpoint tensor in errors. A shared tensor (``output_dim`` None) loaded for a
    second shard must equal the first, since the merged layer can hold only one.
    """
    target = buffer(layer, spec.name)
    if spec.exact_dtype and tensor.dtype != spec.dtype:
        raise CheckpointError(f"{where}: dtype {tensor.dtype}, expected {spec.dtype}")
    if not spec.exact_dtype and not tensor.dtype.is_floating_point:
        raise CheckpointError(f"{where}: dtype {tensor.dtype}, expected a floating-point tensor")
    if spec.output_dim is None:
        part = target
        if tensor.shape != part.shape:
            raise CheckpointError(f"{where}: shape {tuple(tensor.shape)}, expected {tuple(part.shape)}")
        if any(name == spec.name for name, _ in seen) and not torch.equal(part, tensor.to(part.dtype)):
            raise CheckpointError(
                f"{where} differs from the other projections merged into this layer "
                f"({spec.name} must be identical across them)"
            )
    else:
        size = out_sizes[shard]
        offset = sum(out_sizes[:shard])
        if offset % spec.output_pack or size % spec.output_pack:
            raise CheckpointError(
                f"{where}: {size} outputs at offset {offset} are not whole {spec.output_pack}-output words"
            )
        part = target.narrow(spec.output_dim, offset // spec.output_pack, size // spec.output_pack)
        if tensor.shape != part.shape:
            raise CheckpointError(f"{where}: shape {tuple(tensor.shape)}, expected {tuple(part.shape)}")
    part.copy_(tensor)
    seen.add((spec.name, shard))


def missing(specs: Sequence[ParamSpec], num_shards: int, seen: set[tuple[str, int]]) -> list[tuple[str, int]]:
    """(name, shard) pairs a complete load must have had."""
    out = []
    for spec in specs:
        if spec.optional:
            continue
        shards = range(num_shards) if spec.output_dim is not None else [None]
        for shard in shards:
            if shard is None:
                if not any(name == spec.name for name, _ in seen):
                    out.append((spec.name, 0))
            elif (spec.name, shard) not in seen:
                out.append((spec.name, shard))
    return out
