"""Flatten one scheduled step into the arrays the model and attention need (host side, numpy)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from prefixflow.engine.core.request import Request
from prefixflow.engine.core.step_types import SchedulerOutput
from prefixflow.engine.speculative.views import position_views


@dataclass
class StepInputs:
    """One flat varlen batch. Request b owns rows ``query_start_loc[b]:query_start_loc[b+1]``.

    ``sample_rows`` are the rows whose logits pick a next token (one per request that reached its last
    token); ``score_rows``/``score_targets``/``score_owner`` are the prompt positions whose
    log-probability of the following token a request asked for (``Request.score_from``).
    """

    token_ids: np.ndarray
    positions: np.ndarray
    slot_mapping: np.ndarray
    query_start_loc: np.ndarray
    seq_lens: np.ndarray
    block_tables: list[list[int]] | np.ndarray  # an int32 [B, W] array on tensor-parallel workers
    sample_rows: list[int] = field(default_factory=list)
    sample_requests: list[Request] = field(default_factory=list)
    score_rows: list[int] = field(default_factory=list)
    score_targets: list[int] = field(default_factory=list)
    score_owner: list[int] = field(default_factory=list)  # Request.key of each score row
    score_positions: list[int] = field(default_factory=list)  # the target token's prompt position
    score_topk: list[int] = field(default_factory=list)  # prompt_logprobs' k, or -1: the sum only
    speculative: bool = False  # some request verifies drafts: its sample rows are position views
    sampled_requests: list[Request] = field(
        default_factory=list
    )  # one per request that samples, in row order

    @property
    def decode_only(self) -> bool:
        return len(self.token_ids) == len(self.seq_lens) and not self.score_rows


def build_step_inputs(scheduled: SchedulerOutput, block_size: int) -> StepInputs:
    """One pass over the scheduled requests. Decode rows (one token) stay in plain Python ints, which
    is cheaper than a numpy call per request; prefill chunks compute their slots with numpy."""
    ids: list[int] = []
    pos: list[int] = []
    slots: list[int] = []
    starts: list[int] = [0]
    seq_lens: list[int] = []
    tables: list[list[int]] = []
    empty = np.empty(0)
    step = StepInputs(empty, empty, empty, empty, empty, [])
    bs = block_size
    for chunk in scheduled:
        req, n, table = chunk.request, chunk.num_tokens, chunk.block_table
        begin, end = req.num_computed_tokens, req.num_computed_tokens + n
        base = starts[-1]
        if n == 1:
            ids.append(req.token_ids[begin])
            pos.append(begin)
            slots.append(table[begin // bs] * bs + begin % bs)
        else:
            p = np.arange(begin, end, dtype=np.int64)
            ids.extend(req.token_ids[begin:end])
            pos.extend(range(begin, end))
            slots.extend((np.asarray(table, dtype=np.int64)[p // bs] * bs + p % bs).tolist())
        starts.append(base + n)
        seq_lens.append(end)
        tables.append(table)
        first = req.first_scored
        if first is not None:  # prompt positions only (a preempted request recomputes its output too)
            k = req.params.prompt_logprobs
            for q in range(max(begin, first - 1), min(end, req.num_prompt_tokens - 1)):
                step.score_rows.append(base + q - begin)
                step.score_targets.append(req.token_ids[q + 1])
                step.score_owner.append(req.key)
                step.score_positions.append(q + 1)
                step.score_topk.append(-1 if k is None else k)
        if req.generates and end == req.num_tokens:
            step.sampled_requests.append(req)
            if req.num_draft_tokens:  # a verified run: one sample row per position (speculative/verify.py)
                step.sample_rows.extend(range(base + n - 1 - req.num_draft_tokens, base + n))
                step.sample_requests.extend(position_views(req))
                step.speculative = True
            else:
                step.sample_rows.append(base + n - 1)
                step.sample_requests.append(req)
    step.token_ids = np.array(ids, dtype=np.int64)
    step.positions = np.array(pos, dtype=np.int64)
    step.slot_mapping = np.array(slots, dtype=np.int64)
    step.query_start_loc = np.array(starts, dtype=np.int32)
    step.seq_lens = np.array(seq_lens, dtype=np.int32)
    step.block_tables = tables
    return step


def block_table_array(tables: list[list[int]] | np.ndarray, width: int | None = None) -> np.ndarray:
    if isinstance(tables, np.ndarray):  # already padded (a step broadcast to tensor-parallel workers)
        return tables if width is None or width == tables.shape[1] else _widen(tables, width)
    width = width or max(len(t) for t in tables)
    return np.array([t + [0] * (width - len(t)) for t in tables], dtype=np.int32)


def _widen(tables: np.ndarray, width: int) -> np.ndarray:
    out = np.zeros((tables.shape[0], width), dtype=np.int32)
    out[:, : tables.shape[1]] = tables
    return out
