"""Token bitmasks: one bit per vocabulary id (bit ``i % 32`` of int32 word ``i // 32``, 1 = allowed), the
layout the grammar engine fills, applied to a batch of logits with one in-place op."""

from __future__ import annotations

import sys

import numpy as np
import torch

_BYTE_BITS: dict[torch.device, torch.Tensor] = {}


def bitmask_words(vocab_size: int) -> int:
    return (vocab_size + 31) // 32


def allocate_bitmask(rows: int, vocab_size: int) -> torch.Tensor:
    """All-allowed int32 mask on the host (pinned when a GPU will read it, so the copy can overlap)."""
    pin = torch.cuda.is_available()
    return torch.full((rows, bitmask_words(vocab_size)), -1, dtype=torch.int32, pin_memory=pin)


def _byte_bits(device: torch.device) -> torch.Tensor:
    """[256, 8] bool: bit b of byte value v."""
    table = _BYTE_BITS.get(device)
    if table is None:
        values = torch.arange(256, dtype=torch.int32)
        table = ((values[:, None] >> torch.arange(8, dtype=torch.int32)) & 1).bool().to(device)
        _BYTE_BITS[device] = table
    return table


def allowed_tokens(bitmask: torch.Tensor, vocab_size: int, device: torch.device) -> torch.Tensor:
    """[rows, vocab_size] bool on ``device``. Words are little-endian int32, so byte k of word w holds
    tokens 32w+8k .. 32w+8k+7: on the host numpy unpacks them in C; on a GPU a 256-entry table does."""
    return _unpack(bitmask, vocab_size, device, invert=False)


def unpack_with_table(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The device path: one gather from a [256, 8] table (no host round trip)."""
    table = _byte_bits(bitmask.device)
    return table[bitmask.view(torch.uint8).long()].view(bitmask.shape[0], -1)[:, :vocab_size]


def _unpack(bitmask: torch.Tensor, vocab_size: int, device: torch.device, invert: bool) -> torch.Tensor:
    assert sys.byteorder == "little", "token bitmasks assume a little-endian host"
    if device.type == "cpu":
        packed = bitmask.numpy().view(np.uint8)
        if invert:
            packed = np.invert(packed)  # a few KB per row: cheaper than inverting the unpacked mask
        bits = np.unpackbits(packed, axis=1, count=vocab_size, bitorder="little")
        return torch.from_numpy(bits.view(np.bool_))
    allowed = unpack_with_table(bitmask.to(device, non_blocking=True), vocab_size)
    return allowed.logical_not() if invert else allowed


def apply_bitmask_(logits: torch.Tensor, bitmask: torch.Tensor) -> None:
    """Set disallowed logits to -inf in place; all-ones rows (unconstrained requests) stay as they are.

    One op either way: on the host numpy's masked copy (branch-free, several times faster than
    ``masked_fill_`` on a mask with mixed runs), on a GPU ``masked_fill_``.
    """
    disallowed = _unpack(bitmask, logits.shape[-1], logits.device, invert=True)
    if logits.device.type == "cpu" and logits.dtype == torch.float32 and logits.is_contiguous():
        np.copyto(logits.numpy(), np.float32(-np.inf), where=disallowed.numpy())
    else:
        logits.masked_fill_(disallowed, float("-inf"))
