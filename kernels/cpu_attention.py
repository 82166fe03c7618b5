"""Batched paged attention for the CPU: a few padded calls per step instead of a loop over requests.

Same contract as ``reference.paged_attention`` (the oracle). The reference attends request by
request (batching only decodes over short contexts), a dozen torch ops each, once per layer. Here
requests are sorted by (query length, context length) and cut into chunks whose padded scores and
gathered K/V fit a cache-sized budget (so short and long requests do not pad each other); a chunk is
one gather of its K/V blocks, one grouped-query bmm for the scores of all its heads, a mask that is
causal and hides the padding, a softmax and one bmm for the output. Every temporary lives in a
reused per-thread scratch buffer (``kernels/scratch.py``): fresh multi-MiB tensors page-fault on
every call, which on a loaded host costs more than the arithmetic. Padded V rows are zeroed, so
stale cache contents (even NaN) cannot leak through a masked position. Float32 inside.
"""

from __future__ import annotations

import torch

from prefixflow.kernels.scratch import scratch

_SCORE_BUDGET = 1 << 20  # padded float32 score elements per chunk (n x Hq x Qmax x Lmax)
_KV_BUDGET = 4 << 20  # bytes of gathered float32 K plus V per chunk


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


def _gather(cache: torch.Tensor, ids: torch.Tensor, n: int, length: int, name: str) -> torch.Tensor:
    """Blocks ``ids`` of ``cache`` as float32 ``[n, Hkv, length, D]`` (contiguous, in scratch)."""
    block_size, heads, dim = cache.shape[1:]
    raw = torch.index_select(cache, 0, ids, out=scratch(f"{name}-raw", (ids.numel(), block_size, heads, dim), cache.dtype, cache.device))
    raw = raw.view(n, -1, heads, dim)[:, :length]
    out = scratch(name, (n, heads, length, dim), torch.float32, cache.device)
    out.copy_(raw.permute(0, 2, 1, 3))
    return out


def _attend_chunk(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, tables: torch.Tensor,
    starts: list[int], qlens: list[int], lens: list[int], chunk: list[int], scale: float, out: torch.Tensor,
) -> None:  # fmt: skip
    dev = q.device
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    num_q_heads = q.shape[1]
    group = num_q_heads // num_kv_heads
    n = len(chunk)
    q_max, l_max = max(qlens[b] for b in chunk), max(lens[b] for b in chunk)
    blocks = -(-l_max // block_size)
    idx = torch.tensor(chunk, device=dev)
    seq = torch.tensor([lens[b] for b in chunk], device=dev)
    ql = torch.tensor([qlens[b] for b in chunk], device=dev)
    used = torch.arange(blocks, device=dev)[None, :] * block_size < seq[:, None]
    ids = torch.where(used, tables[idx, :blocks], 0).flatten()
    k = _gather(k_cache, ids, n, l_max, "k")  # [n, Hkv, L, D]
    v = _gather(v_cache, ids, n, l_max, "v")
    valid = torch.arange(l_max, device=dev)[None, :] < seq[:, None]  # [n, L]
    v.masked_fill_(~valid[:, None, :, None], 0.0)

    offs = torch.arange(q_max, device=dev)
    q_ok = offs[None, :] < ql[:, None]  # [n, Qmax]
    first = torch.tensor([starts[b] for b in chunk], device=dev)
    rows = torch.where(q_ok, first[:, None] + offs[None, :], first[:, None]).flatten()  # padding repeats row 0
    qb = scratch("q", (n, q_max, num_kv_heads, group, head_dim), torch.float32, dev)
    qb.copy_(q.index_select(0, rows).view(n, q_max, num_kv_heads, group, head_dim))
    qh = scratch("qh", (n, num_kv_heads, group, q_max, head_dim), torch.float32, dev)
    qh.copy_(qb.permute(0, 2, 3, 1, 4))  # rows of one KV head together: (query head, query position)
    flat = n * num_kv_heads
    scores = scratch("scores", (flat, group * q_max, l_max), torch.float32, dev)
    torch.bmm(qh.view(flat, group * q_max, head_dim), k.view(flat, l_max, head_dim).transpose(1, 2), out=scores)
    q_pos = (seq - ql)[:, None] + offs[None, :]  # [n, Qmax] context position of each query row
    hidden = (torch.arange(l_max, device=dev)[None, None, :] > q_pos[:, :, None]) | ~valid[:, None, :]
    scores4 = scores.view(n, num_kv_heads, group, q_max, l_max)
    scores4.masked_fill_(hidden[:, None, None], float("-inf"))
    scores.mul_(scale)
    scores.sub_(scores.amax(-1, keepdim=True)).exp_()
    scores.div_(scores.sum(-1, keepdim=True))
    o = scratch("o", (flat, group * q_max, head_dim), torch.float32, dev)
    torch.bmm(scores, v.view(flat, l_max, head_dim), out=o)
    o5 = o.view(n, num_kv_heads, group, q_max, head_dim).permute(0, 3, 1, 2, 4)  # [n, Qmax, Hkv, G, D]
    keep = q_ok.flatten()
    out[rows[keep]] = o5.reshape(n * q_max, num_q_heads, head_dim)[keep].to(out.dtype)


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """The contract of ``reference.paged_attention``, computed chunk-wise."""
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
