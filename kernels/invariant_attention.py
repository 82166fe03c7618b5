"""Batch-invariant paged attention for the CPU: a row's result never depends on the other rows of a step.

Why: the batched kernel (``cpu_attention``) pads each chunk to its longest query and context, so the
shapes of the SDPA call a token is computed in, and with them the float bits of its result, depend
on which other requests share the step and on how its prompt was cut into prefill chunks (or served
from the prefix cache). That is what makes a resumed label shard differ from an uninterrupted run in
the last bits (benchmarks/RESULTS.md, issue 26). Here every query row attends as a one-token query
over its own context, zero-padded to a whole number of blocks: the per-row shapes are fixed by the
row's own position, so the bits are too. Rows whose padded contexts have the same length share one
pair of batched matmuls (each batch entry is its own product, so the batch size changes no row's bits;
torch's CPU flash SDPA does not keep that in float32), cut to a byte budget. Computes in float32. Same contract as ``reference.paged_attention``; slower than ``cpu_attention`` on long prompts
(one query per call row instead of a causal block), so it is used only when the engine is asked for
batch-invariant results (``EngineConfig.batch_invariant``).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch

_KV_BUDGET = 8 << 20  # bytes of gathered K plus V per call


@dataclass(frozen=True)
class _Call:
    """One batched call: ``n`` query rows whose contexts pad to the same ``length``."""

    ids: torch.Tensor  # [n * blocks] block ids to gather
    past: torch.Tensor  # [n, length] bool: not the row's context
    rows: torch.Tensor  # [n] query rows
    n: int
    length: int


@dataclass(frozen=True)
class _Plan:
    key: tuple[object, ...]
    tables: torch.Tensor
    starts: torch.Tensor
    lens: torch.Tensor
    calls: list[_Call]


_local = threading.local()


def paged_attention_invariant(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The contract of ``reference.paged_attention``, one query row at a time (grouped by padded length)."""
    num_q_heads = q.shape[1]
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"query heads {num_q_heads} not a multiple of kv heads {num_kv_heads}")
    token_bytes = 2 * num_kv_heads * head_dim * k_cache.element_size()
    out = torch.empty_like(q)
    for call in _plan(block_tables, query_start_loc, seq_lens, block_size, token_bytes, k_cache.device):
        _attend(q, k_cache, v_cache, call, scale, out)
    return out


def _plan(
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    token_bytes: int,
    dev: torch.device,
) -> list[_Call]:
    """The step's calls, built once and reused by every layer while the step's metadata is unchanged
    (checked by value, as ``cpu_attention`` does)."""
    key = (block_size, token_bytes, dev.type, dev.index or 0, _KV_BUDGET)
    last: _Plan | None = getattr(_local, "plan", None)
    if (
        last is not None
        and last.key == key
        and torch.equal(query_start_loc, last.starts)
        and torch.equal(seq_lens, last.lens)
        and torch.equal(block_tables, last.tables)
    ):
        return last.calls
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    groups: dict[int, list[tuple[int, int, int]]] = {}  # blocks -> (row, request, context length)
    for b, seq_len in enumerate(lens):
        query_len = starts[b + 1] - starts[b]
        if query_len > seq_len:
            raise ValueError(f"request {b}: {query_len} queries but only {seq_len} context tokens")
        for i in range(query_len):
            ctx = seq_len - query_len + i + 1
            groups.setdefault(-(-ctx // block_size), []).append((starts[b] + i, b, ctx))
    tables = block_tables.to(device=dev, dtype=torch.long)
    calls: list[_Call] = []
    for blocks, members in sorted(groups.items()):
        length = blocks * block_size
        per_call = max(1, _KV_BUDGET // (length * token_bytes))
        for at in range(0, len(members), per_call):
            rows, reqs, ctxs = zip(*members[at : at + per_call])
            ctx = torch.tensor(ctxs, device=dev)
            calls.append(
                _Call(
                    ids=tables[torch.tensor(reqs, device=dev), :blocks].flatten(),
                    past=torch.arange(length, device=dev)[None, :] >= ctx[:, None],
                    rows=torch.tensor(rows, device=dev),
                    n=len(rows),
                    length=length,
                )
            )
    _local.plan = _Plan(key, block_tables.clone(), query_start_loc.clone(), seq_lens.clone(), calls)
    return calls


def _attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, c: _Call, scale: float, out: torch.Tensor
) -> None:
    """One query row per batch entry; a KV head's query heads are the rows of its matmuls (always the
    same heads of the same token), so no other row can change a row's summation order."""
    heads, dim = k_cache.shape[2:]
    group = q.shape[1] // heads
    past = c.past
    # index_select copies, so the stale positions (even NaN) are zeroed in place before any product
    k = (
        k_cache.index_select(0, c.ids)
        .view(c.n, c.length, heads, dim)
        .masked_fill_(past[:, :, None, None], 0.0)
    )
    v = (
        v_cache.index_select(0, c.ids)
        .view(c.n, c.length, heads, dim)
        .masked_fill_(past[:, :, None, None], 0.0)
    )
    # contiguous operands: a strided one lets the batched matmul pick its path by the batch size
    qn = q.index_select(0, c.rows).float().view(c.n, heads, group, dim)
    kt = k.float().permute(0, 2, 3, 1).contiguous()  # [n, Hkv, D, L]
    scores = torch.matmul(qn, kt) * scale  # [n, Hkv, G, L]
    scores.masked_fill_(past[:, None, None, :], float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    o = torch.matmul(probs, v.float().transpose(1, 2).contiguous())  # [n, Hkv, G, D]
    out.index_copy_(0, c.rows, o.view(c.n, q.shape[1], dim).to(out.dtype))
