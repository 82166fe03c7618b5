"""Shared builders and error measures for the kernel tests (imported by test modules by name)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


@dataclass
class PagedBatch:
    """A step's attention inputs over a paged cache, plus the dense per-request K/V they came from."""

    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    query_start_loc: torch.Tensor
    seq_lens: torch.Tensor
    dense_k: list[torch.Tensor]  # request b: [seq_len, Hkv, D]
    dense_v: list[torch.Tensor]
    query_lens: list[int]


def build_paged_batch(
    shapes: list[tuple[int, int]],
    num_q_heads: int,
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device = DEVICE,
    seed: int = 0,
) -> PagedBatch:
    """shapes: (query_len, seq_len) per request. Blocks are scattered in a shuffled pool; every
    slot not holding a real token (spare blocks, tails of last blocks, table padding) is NaN, so a
    kernel that reads past a context leaks NaN into its output."""
    gen = torch.Generator().manual_seed(seed)
    blocks_per_req = [-(-s // block_size) for _, s in shapes]
    num_blocks = sum(blocks_per_req) + 3
    cache_shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    v_cache = torch.full(cache_shape, float("nan"), dtype=dtype)
    order = torch.randperm(num_blocks, generator=gen).tolist()
    nan_block = order.pop()  # padding entries of the tables point here
    max_blocks = max(blocks_per_req) + 1
    tables = torch.full((len(shapes), max_blocks), nan_block, dtype=torch.int32)
    dense_k, dense_v = [], []
    for b, (_, seq_len) in enumerate(shapes):
        k = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        v = torch.randn(seq_len, num_kv_heads, head_dim, generator=gen).to(dtype)
        dense_k.append(k.to(device))
        dense_v.append(v.to(device))
        for i in range(blocks_per_req[b]):
            blk = order.pop()
            tables[b, i] = blk
            lo, hi = i * block_size, min((i + 1) * block_size, seq_len)
            k_cache[blk, : hi - lo] = k[lo:hi]
            v_cache[blk, : hi - lo] = v[lo:hi]
    query_lens = [ql for ql, _ in shapes]
    starts = [0]
    for ql in query_lens:
        starts.append(starts[-1] + ql)
    q = torch.randn(starts[-1], num_q_heads, head_dim, generator=gen).to(dtype)
    return PagedBatch(
        q=q.to(device),
        k_cache=k_cache.to(device),
        v_cache=v_cache.to(device),
        block_tables=tables.to(device),
        query_start_loc=torch.tensor(starts, dtype=torch.int32, device=device),
        seq_lens=torch.tensor([s for _, s in shapes], dtype=torch.int32, device=device),
        dense_k=dense_k,
        dense_v=dense_v,
        query_lens=query_lens,
    )


def poisoned_like(t: torch.Tensor) -> torch.Tensor:
    """An output buffer that cannot pass a comparison unless every element is written."""
    return torch.full_like(t, float("nan"))


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """max |out - ref| / max |ref|; NaN anywhere in out counts as infinite error."""
    if torch.isnan(out).any():
        return float("inf")
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max().clamp_min(1e-30)).item()


def step_args(batch: PagedBatch) -> tuple[torch.Tensor, ...]:
    """The paged-attention arguments of ``batch`` (without the scale)."""
    return (batch.q, batch.k_cache, batch.v_cache, batch.block_tables, batch.query_start_loc, batch.seq_lens)


def request_alone(batch: PagedBatch, b: int, rows: slice | None = None) -> tuple[torch.Tensor, ...]:
    """Request ``b`` of ``batch`` alone (optionally only its query rows ``rows``), as its own step."""
    start, end = int(batch.query_start_loc[b]), int(batch.query_start_loc[b + 1])
    q = batch.q[start:end]
    seq_len = int(batch.seq_lens[b])
    if rows is not None:
        seq_len -= q.shape[0] - rows.stop
        q = q[rows]
    return (
        q,
        batch.k_cache,
        batch.v_cache,
        batch.block_tables[b : b + 1],
        torch.tensor([0, q.shape[0]], dtype=torch.int32),
        torch.tensor([seq_len], dtype=torch.int32),
    )
