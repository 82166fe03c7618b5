"""Bit unpacking shared by the checkpoint formats (their packing axes and orders differ, the shifts do not)."""

from __future__ import annotations

import torch

from prefixflow.kernels.quant_weight import pack_along_rows

# AWQ's GEMM layout puts output column 8j + AWQ_ORDER[i] in nibble i of word j.
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


def unpack_cols(
    packed: torch.Tensor, bits: int, cols: int, order: tuple[int, ...] | None = None
) -> torch.Tensor:
    """int32 ``[R, ceil(cols / pack)]`` packed along its last axis -> int32 ``[R, cols]`` unsigned values.

    Value ``i`` of word ``j`` is column ``j * pack + order[i]`` (``order`` defaults to 0, 1, 2, ...).
    """
    pack = 32 // bits
    shifts = torch.arange(pack, device=packed.device, dtype=torch.int32) * bits
    values = (packed[..., None] >> shifts) & ((1 << bits) - 1)  # [R, W, pack]: value i of each word
    if order is not None:
        inverse = [0] * pack
        for nibble, column in enumerate(order):
            inverse[column] = nibble
        values = values[..., inverse]
    return values.reshape(packed.shape[0], -1)[:, :cols]


def repack_rows(q: torch.Tensor, bits: int) -> torch.Tensor:
    """Unsigned values ``[K, N]`` -> the engine's ``PackedWeight.qweight`` layout."""
    return pack_along_rows(q, bits)


def narrow_scales(scales: torch.Tensor) -> torch.Tensor:
    """The narrowest of float16, bfloat16, float32 that holds every scale exactly (checkpoints store
    float16 or bfloat16; loading goes through float32 so neither is rounded)."""
    for dtype in (torch.float16, torch.bfloat16):
        narrow = scales.to(dtype)
        if torch.equal(narrow.float(), scales.float()):
            return narrow
    return scales.float()
