"""One step's model inputs as a single int64 tensor, so rank 0 can broadcast it to the workers.

Why not pickle: a step of a large batch carries tens of thousands of ints; one flat tensor costs one
copy and one broadcast, has no per-request Python objects, and its length travels in the command
header, so there is no buffer size a large batch could overflow.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

_HEADER = 5  # tokens, sequences, block-table width, logit rows, flags
_DECODE_ONLY = 1


@dataclass(frozen=True)
class StepBatch:
    """What every rank needs to run one forward pass over a flat varlen batch.

    ``logit_rows`` are the rows of the hidden states whose logits rank 0 needs (sampled and scored
    positions); every rank computes its vocabulary slice for them and the gather assembles the rows.
    """

    token_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    query_start_loc: np.ndarray  # [B + 1] int32
    seq_lens: np.ndarray  # [B] int32
    block_tables: np.ndarray  # [B, W] int32
    logit_rows: np.ndarray  # [R] int64
    decode_only: bool

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


def pack(step: StepBatch) -> torch.Tensor:
    t, b = len(step.token_ids), len(step.seq_lens)
    w = step.block_tables.shape[1] if step.block_tables.ndim == 2 else 0
    header = np.array(
        [t, b, w, len(step.logit_rows), _DECODE_ONLY if step.decode_only else 0], dtype=np.int64
    )
    parts = [
        header,
        step.token_ids,
        step.positions,
        step.slot_mapping,
        step.query_start_loc,
        step.seq_lens,
        step.block_tables.reshape(-1),
        step.logit_rows,
    ]
    return torch.from_numpy(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]))


def unpack(payload: torch.Tensor) -> StepBatch:
    flat = payload.numpy()
    t, b, w, r, flags = (int(v) for v in flat[:_HEADER])
    sizes = [t, t, t, b + 1, b, b * w, r]
    expected = _HEADER + sum(sizes)
    if len(flat) != expected:
        raise ValueError(f"step payload has {len(flat)} values, its header describes {expected}")
    out: list[np.ndarray] = []
    at = _HEADER
    for size in sizes:
        out.append(flat[at : at + size])
        at += size
    return StepBatch(
        token_ids=out[0],
        positions=out[1],
        slot_mapping=out[2],
        query_start_loc=out[3].astype(np.int32),
        seq_lens=out[4].astype(np.int32),
        block_tables=out[5].astype(np.int32).reshape(b, w),
        logit_rows=out[6],
        decode_only=bool(flags & _DECODE_ONLY),
    )
