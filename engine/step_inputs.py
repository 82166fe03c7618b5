"""Flatten one scheduled step into the arrays the model and attention need (host side, numpy)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engine.request import Request


@dataclass
class StepInputs:
    token_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: list[list[int]]
    sample_rows: list[int] = field(default_factory=list)
    sample_requests: list[Request] = field(default_factory=list)
    score_rows: list[int] = field(default_factory=list)
    score_targets: list[int] = field(default_factory=list)
    score_owner: list[int] = field(default_factory=list)

    @property
    def decode_only(self) -> bool:
        return len(self.token_ids) == len(self.seq_lens) and not self.score_rows


def build_step_inputs(scheduled: list[tuple[Request, int]], block_size: int) -> StepInputs:
    """One pass over the scheduled requests; per-token work is vectorised with numpy."""
    ids, pos, slots, starts, seq_lens, tables = [], [], [], [0], [], []
    step = StepInputs(np.empty(0), np.empty(0), np.empty(0), np.empty(0), np.empty(0), [])
    for req, n in scheduled:
        begin, end = req.num_computed_tokens, req.num_computed_tokens + n
        base = starts[-1]
        p = np.arange(begin, end, dtype=np.int64)
        table = np.asarray(req.block_table, dtype=np.int64)
        ids.append(np.asarray(req.token_ids[begin:end], dtype=np.int64))
        pos.append(p)
        slots.append(table[p // block_size] * block_size + p % block_size)
        starts.append(base + n)
        seq_lens.append(end)
        tables.append(req.block_table)
        if req.score_start is not None:
            for q in range(max(begin, req.score_start - 1), min(end, req.num_tokens - 1)):
                step.score_rows.append(base + q - begin)
                step.score_targets.append(req.token_ids[q + 1])
                step.score_owner.append(req.index)
        elif end == req.num_tokens:
            step.sample_rows.append(base + n - 1)
            step.sample_requests.append(req)
    step.token_ids = np.concatenate(ids)
    step.positions = np.concatenate(pos)
    step.slot_mapping = np.concatenate(slots)
    step.query_start_loc = np.asarray(starts, dtype=np.int32)
    step.seq_lens = np.asarray(seq_lens, dtype=np.int32)
    step.block_tables = tables
    return step


def block_table_array(tables: list[list[int]], width: int | None = None) -> np.ndarray:
    width = width or max(len(t) for t in tables)
    out = np.zeros((len(tables), width), dtype=np.int32)
    for i, t in enumerate(tables):
        out[i, : len(t)] = t
    return out
