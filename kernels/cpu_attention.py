"""Batched paged attention for the CPU: a few padded ``scaled_dot_product_attention`` calls per step.

Same contract as ``reference.paged_attention`` (the oracle). The reference attends request by
request, a dozen torch ops each, once per layer: with 64 running requests that Python loop is most
of a CPU decode step. Here requests are sorted by (query length, context length) and cut into
chunks; each chunk is one gather of its K/V blocks, one padded query tensor and one SDPA call
(grouped-query heads via ``enable_gqa``) under a mask that is causal and hides the padding. A chunk
is closed when its padded scores or its gathered K/V would outgrow a cache-sized budget, so short
and long requests do not pad each other. Padded K/V rows are zeroed, so stale cache contents cannot
leak through a masked position (0 x NaN is NaN).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

_SCORE_BUDGET = 1 << 21  # padded score elements per chunk (B x Hq x Qmax x Lmax)
_KV_BUDGET = 8 << 20  # bytes of gathered float32 K plus V per chunk


def _chunks(order: list[int], qlens: list[int], lens: list[int], heads: int, kv_token_bytes: int) -> list[list[int]]:
    chunks: list[list[int]] = []
    q_max = l_max = 0
    for b in order:
        if chunks:
            n, qm, lm = len(chunks[-1]) + 1, max(q_max, qlens[b]), max(l_max, lens[b])
            if n * heads * qm * lm <= _SCORE_BUDGET and n * lm * kv_token_bytes <= _KV_BUDGET:
                chunks[-1].append(b)
                q_max, l_max = qm, lm
                continue
        chunks.append([b])
        q_max, l_max = qlens[b], lens[b]
    return chunks


def _attend_chunk(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    starts: list[int],
    qlens: list[int],
    lens: list[int],
    chunk: list[int],
    scale: float,
    out: torch.Tensor,
) -> None:
    dev = q.device
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    n = len(chunk)
    q_max, l_max = max(qlens[b] for b in chunk), max(lens[b] for b in chunk)
    blocks = -(-l_max // block_size)
    idx = torch.tensor(chunk, device=dev)
    seq = torch.tensor([lens[b] for b in chunk], device=dev)
    ql = torch.tensor([qlens[b] for b in chunk], device=dev)
    used = torch.arange(blocks, device=dev)[None, :] * block_size < seq[:, None]
    ids = torch.where(used, tables[idx, :blocks], 0).flatten()
    shape = (n, blocks * block_size, num_kv_heads, head_dim)
    valid = torch.arange(l_max, device=dev)[None, :] < seq[:, None]  # [n, L]
    k = k_cache.index_select(0, ids).view(shape)[:, :l_max].float().masked_fill(~valid[..., None, None], 0.0)
    v = v_cache.index_select(0, ids).view(shape)[:, :l_max].float().masked_fill(~valid[..., None, None], 0.0)

    offs = torch.arange(q_max, device=dev)
    q_ok = offs[None, :] < ql[:, None]  # [n, Qmax]
    first = torch.tensor([starts[b] for b in chunk], device=dev)
    rows = torch.where(q_ok, first[:, None] + offs[None, :], first[:, None])  # padded rows repeat the first
    qb = q.index_select(0, rows.flatten()).view(n, q_max, *q.shape[1:]).float()
    q_pos = (seq - ql)[:, None] + offs[None, :]  # context position of each query row
    mask = (torch.arange(l_max, device=dev)[None, None, :] <= q_pos[:, :, None]) & valid[:, None, :]
    o = F.scaled_dot_product_attention(
        qb.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask[:, None], scale=scale,
        enable_gqa=True,
    )  # fmt: skip
    o = o.transpose(1, 2)  # [n, Qmax, Hq, D]
    keep = q_ok.flatten()
    out[rows.flatten()[keep]] = o.reshape(n * q_max, *q.shape[1:])[keep].to(out.dtype)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The contract of ``reference.paged_attention``, computed chunk-wise (float32 inside)."""
    num_q_heads = q.shape[1]
    num_kv_heads, head_dim = k_cache.shape[2], k_cache.shape[3]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"query heads {num_q_heads} not a multiple of kv heads {num_kv_heads}")
    out = torch.empty_like(q)
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    qlens = [starts[b + 1] - starts[b] for b in range(len(lens))]
    for b, (query_len, seq_len) in enumerate(zip(qlens, lens)):
        if query_len > seq_len:
            raise ValueError(f"request {b}: {query_len} queries but only {seq_len} context tokens")
    order = sorted((b for b in range(len(lens)) if qlens[b] > 0), key=lambda b: (qlens[b], lens[b]))
    tables = block_tables.to(device=k_cache.device, dtype=torch.long)
    kv_token_bytes = 2 * num_kv_heads * head_dim * 4
    for chunk in _chunks(order, qlens, lens, num_q_heads, kv_token_bytes):
        _attend_chunk(q, k_cache, v_cache, tables, starts, qlens, lens, chunk, scale, out)
    return out
