"""Pure-torch kernels: the CPU execution path and the oracle every Triton kernel is tested against.

Shapes and semantics are those of docs/contracts.md ("engine <-> kernels"). Arithmetic that
accumulates (softmax, norms, activations) runs in float32 and is cast back to the input dtype.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from prefixflow.kernels.rope_cache import build_rope_cache

__all__ = ["build_rope_cache", "paged_attention", "rms_norm", "rotary", "silu_and_mul", "store_kv"]


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write key/value [T, Hkv, D] into the paged caches at slot = block * block_size + offset.

    Slot -1 marks tokens whose K/V must not be written (e.g. padding or already-cached tokens).
    """
    num_blocks, block_size = k_cache.shape[:2]
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    k_flat = k_cache.view(num_blocks * block_size, *k_cache.shape[2:])
    v_flat = v_cache.view(num_blocks * block_size, *v_cache.shape[2:])
    k_flat[slots] = key[keep].to(k_cache.dtype)
    v_flat[slots] = value[keep].to(v_cache.dtype)


def _gather_context(cache: torch.Tensor, block_ids: torch.Tensor, seq_len: int) -> torch.Tensor:
    """The first seq_len cached tokens of one request, contiguous: [seq_len, Hkv, D]."""
    blocks = cache.index_select(0, block_ids)  # [n, block_size, Hkv, D]
    return blocks.reshape(-1, *cache.shape[2:])[:seq_len]


def _decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    scale: float,
) -> torch.Tensor:
    """All single-token requests at once, contexts padded to max_len and the padding masked out.

    q [Bd, Hq, D] sit at the last positions of their contexts, so there is no causal mask. Whole
    blocks are gathered (contiguous copies); padded table entries are replaced by block 0, and
    padded V rows are zeroed so stale or NaN cache contents cannot leak through a zero weight.
    """
    num_reqs, num_q_heads, head_dim = q.shape
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    max_blocks = -(-max_len // block_size)
    lens = seq_lens.to(k_cache.device)
    used = torch.arange(max_blocks, device=k_cache.device)[None, :] * block_size < lens[:, None]
    ids = torch.where(used, tables[:, :max_blocks], 0).flatten()
    shape = (num_reqs, max_blocks * block_size, num_kv_heads, head_dim)
    k = k_cache.index_select(0, ids).view(shape)[:, :max_len]
    v = v_cache.index_select(0, ids).view(shape)[:, :max_len]
    valid = torch.arange(max_len, device=k.device)[None, :] < lens[:, None]  # [Bd, L]
    v = v.masked_fill(~valid[:, :, None, None], 0.0)
    qg = q.float().view(num_reqs, num_kv_heads, num_q_heads // num_kv_heads, head_dim)
    out = torch.empty_like(qg)
    for h in range(num_kv_heads):  # strided bmm per KV head: no permuted copies of K/V
        scores = torch.bmm(qg[:, h], k[:, :, h].float().transpose(1, 2)) * scale  # [Bd, G, L]
        scores.masked_fill_(~valid[:, None, :], float("-inf"))
        out[:, h] = torch.bmm(torch.softmax(scores, dim=-1), v[:, :, h].float())
    return out.reshape(num_reqs, num_q_heads, head_dim).to(q.dtype)


# Decodes whose float32 K context is at most _SHORT_BYTES are batched (their per-request op overhead
# would dominate), in chunks whose padded K gather stays cache-resident; longer ones go one by one.
_SHORT_BYTES = 64 << 10
_DECODE_CHUNK_BYTES = 2 << 20


def _decode_chunks(decodes: list[int], lens: list[int], bytes_per_token: int) -> list[list[int]]:
    """Split length-sorted decode requests into runs whose padded K gather fits the chunk budget."""
    chunks: list[list[int]] = []
    for b in decodes:
        if chunks and (len(chunks[-1]) + 1) * lens[b] * bytes_per_token <= _DECODE_CHUNK_BYTES:
            chunks[-1].append(b)
        else:
            chunks.append([b])
    return chunks


def paged_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Varlen causal attention over a paged KV cache.

    Request b's queries are the last query_len positions of its seq_lens[b]-token context, so the
    query at context position p sees keys 0..p. Query heads are grouped per KV head (GQA/MQA), so
    K/V are never repeated in memory. Short single-token (decode) requests are batched into padded
    chunks; every other request is one batched matmul over its gathered blocks.
    """
    num_tokens, num_q_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"query heads {num_q_heads} not a multiple of kv heads {num_kv_heads}")
    group = num_q_heads // num_kv_heads
    block_size = k_cache.shape[1]
    out = torch.empty_like(q)

    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    tables = block_tables.to(device=k_cache.device, dtype=torch.long)
    token_bytes = num_kv_heads * head_dim * 4
    short = [
        b
        for b in range(len(lens))
        if starts[b + 1] - starts[b] == 1 and lens[b] * token_bytes <= _SHORT_BYTES
    ]
    short.sort(key=lens.__getitem__)
    for chunk in _decode_chunks(short, lens, token_bytes):
        rows = torch.tensor([starts[b] for b in chunk], device=q.device)
        idx = torch.tensor(chunk, device=k_cache.device)
        chunk_lens = seq_lens.to(k_cache.device)[idx]
        out[rows] = _decode_attention(
            q[rows], k_cache, v_cache, tables[idx], chunk_lens, lens[chunk[-1]], scale
        )
    batched = set(short)
    for b, seq_len in enumerate(lens):
        q_begin, q_end = starts[b], starts[b + 1]
        query_len = q_end - q_begin
        if query_len == 0 or b in batched:
            continue
        if query_len > seq_len:
            raise ValueError(f"request {b}: {query_len} queries but only {seq_len} context tokens")
        num_blocks = -(-seq_len // block_size)
        ids = tables[b, :num_blocks]
        k = _gather_context(k_cache, ids, seq_len).float().permute(1, 0, 2)  # [Hkv, L, D]
        v = _gather_context(v_cache, ids, seq_len).float().permute(1, 0, 2)
        qb = q[q_begin:q_end].float().view(query_len, num_kv_heads, group, head_dim)
        qb = qb.permute(1, 2, 0, 3).reshape(num_kv_heads, group * query_len, head_dim)

        scores = torch.bmm(qb, k.transpose(1, 2)) * scale  # [Hkv, G*Tq, L]
        q_pos = torch.arange(seq_len - query_len, seq_len, device=q.device).repeat(group)
        k_pos = torch.arange(seq_len, device=q.device)
        scores.masked_fill_(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        ob = torch.bmm(probs, v).view(num_kv_heads, group, query_len, head_dim)
        out[q_begin:q_end] = ob.permute(2, 0, 1, 3).reshape(query_len, num_q_heads, head_dim).to(q.dtype)
    return out


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm over the last dim; with a residual, first add it and also return the sum.

    The sum is rounded to x.dtype before normalising, exactly as an unfused add-then-norm would
    see it, so fused and unfused paths agree bit-for-bit in the residual stream.
    """
    new_residual = None
    if residual is not None:
        new_residual = (x.float() + residual.float()).to(x.dtype)
        x = new_residual
    xf = x.float()
    normed = xf * torch.rsqrt(xf.pow(2).mean(dim=-1, keepdim=True) + eps)
    out = weight * normed.to(x.dtype)
    out = out.to(x.dtype)
    return out if new_residual is None else (out, new_residual)


def _rotate_neox(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox layout: pair i is (x[i], x[i + D/2])."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


def rotary(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Neox-style rotary embedding of q [T, Hq, D] and k [T, Hkv, D]; returns new tensors."""
    head_dim = q.shape[-1]
    if cos_sin_cache.shape[-1] != head_dim:
        raise ValueError(f"cos_sin_cache width {cos_sin_cache.shape[-1]} != head_dim {head_dim}")
    cs = cos_sin_cache.index_select(0, positions.long()).float()
    cos, sin = cs[:, None, : head_dim // 2], cs[:, None, head_dim // 2 :]
    return _rotate_neox(q, cos, sin), _rotate_neox(k, cos, sin)


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """SwiGLU gate: silu(x[:, :I]) * x[:, I:] for the fused gate/up projection output [T, 2I]."""
    half = x.shape[-1] // 2
    xf = x.float()
    return (F.silu(xf[..., :half]) * xf[..., half:]).to(x.dtype)
