"""Batched paged attention for the CPU: torch's fused SDPA over gathered blocks, planned once per step.

Same contract as ``reference.paged_attention`` (the oracle). Requests are sorted by (query length,
context length) and cut into chunks whose gathered K/V fit a cache-sized budget (so short and long
requests do not pad each other). A chunk is one ``index_select`` of its K and of its V blocks into
reused scratch buffers, then one ``scaled_dot_product_attention`` call on strided views of them (the
CPU flash kernel: no score matrix, no permuted copy of K/V, grouped-query heads without repeating
K/V), with a mask that is causal and hides the padding (``is_causal`` when a chunk has none).

Why a plan: the chunking, block ids, masks and row indices depend only on the step's block tables,
query starts and context lengths, which every layer of a step shares. They are built once and
reused while those three tensors keep the same contents (checked by value, so a caller that refills
the same tensors in place gets a new plan). Before: ~25 small tensor ops per layer per step, and a
gather + permute copy + two bmm + mask + softmax passes, 3-8x slower at 144-1024-token contexts
(benchmarks/RESULTS.md, issue 24).

Single-query chunks (decode) in a reduced-precision cache (bf16, fp16) on a CPU without AMX tiles take
``_single_query`` instead of SDPA: two batched matmuls with float32 scores (with AMX, SDPA is faster:
``_sdpa_decodes``). Why: torch's CPU flash kernel packs K and V per query
head and query block, which at one query row costs far more than the math. Measured on a 2-core Zen 4
(native bf16), 1 thread, SmolLM2's heads, process CPU ms per call: 64 decodes over 160 tokens 12.2 vs
2.6 (4.8x), 16 over 1,024 29.2 vs 6.0, 64 over 1,024 96 vs 45; only a lone request over 32 tokens
(0.07 vs 0.15 ms) was faster with SDPA, hence the ``_MATH_MIN`` floor on requests x context. Float32
SDPA was level with the math (0.9-1.2x), and at 2+ query rows SDPA won as often as it lost, so both
stay on SDPA (benchmarks/RESULTS.md issue 24, "Fifth round"). The scores are float32 (q and K upcast),
so the error is SDPA's own order (max 0.003 against a float32 oracle, SDPA 0.002).

Padded K and V positions are zeroed, so stale cache contents (even NaN) cannot leak through a masked
position (a masked score is ``-inf`` added, and ``NaN - inf`` is NaN). Computes in the cache dtype.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from prefixflow.kernels.cpu_features import amx_tiles
from prefixflow.kernels.scratch import scratch

_KV_BUDGET = 8 << 20  # bytes of gathered K plus V per chunk
_MASK_BUDGET = 1 << 22  # mask elements per chunk (n x Qmax x L)
_MATH_MIN = 128  # requests x gathered context from which a reduced-precision decode chunk skips SDPA
_PER_HEAD_MIN = 2048  # requests x context from which decode matmuls go one KV head at a time (no K/V copy)
_PAD_WASTE = 0.25  # padded query-key pairs a chunk may add, as a share of its real ones ...
_PAD_FLOOR = 4096  # ... or this many, whichever is more (another chunk costs ~10 small ops per layer)


_SDPA_DECODES: bool | None = None  # reduced-precision decodes on SDPA; None: where the CPU has AMX tiles


def _sdpa_decodes() -> bool:
    """Whether single-query chunks in a bf16/fp16 cache stay on SDPA. Where the CPU has AMX tiles,
    torch's flash kernel multiplies bf16 on them and beat the two-matmul path 2.0-2.9x at every decode
    shape measured (1-64 requests over 32-2,048 tokens; 1.2x end to end at batch 64: benchmarks/RESULTS.md
    issue 24, "Eighth round"); on AVX512-BF16 without AMX (Zen 4) it lost 2.6-4.8x."""
    global _SDPA_DECODES
    if _SDPA_DECODES is None:
        _SDPA_DECODES = amx_tiles()
    return _SDPA_DECODES


@dataclass(frozen=True)
class _Chunk:
    ids: torch.Tensor  # [n * blocks] block ids to gather (unused table entries -> block 0)
    n: int
    q_max: int
    length: int  # blocks * block_size: the gathered (padded) context
    pad: torch.Tensor | None  # flat positions of [n * length] that hold no context token (zeroed)
    mask: torch.Tensor | None  # [n, 1, q_max, length] bool, True = attend; None with ``causal``
    causal: bool  # every request: q_max queries over exactly q_max tokens, no padding
    rows: torch.Tensor  # [n * q_max] query rows (padding repeats the request's first row)
    keep: torch.Tensor | None  # [n * q_max] rows that are real (None: all)


@dataclass(frozen=True)
class _Plan:
    key: tuple[object, ...]
    tables: torch.Tensor
    starts: torch.Tensor
    lens: torch.Tensor
    chunks: list[_Chunk]

    def matches(
        self, key: tuple[object, ...], tables: torch.Tensor, starts: torch.Tensor, lens: torch.Tensor
    ) -> bool:
        return (
            key == self.key
            and torch.equal(starts, self.starts)
            and torch.equal(lens, self.lens)
            and torch.equal(tables, self.tables)
        )


_local = threading.local()


def _split(order: list[int], qlens: list[int], lens: list[int], kv_token_bytes: int) -> list[list[int]]:
    """Consecutive requests of ``order`` (sorted by query, then context length) grouped into chunks.

    A request joins the current chunk while the gathered K/V and the mask fit their budgets and the
    padding stays small: a chunk computes ``n x q_max x L`` query-key pairs, and joining must not make
    that more than ``_PAD_WASTE`` over the real ones (beyond ``_PAD_FLOOR``, under which another chunk's
    calls cost more). Why: continuous batching puts decodes and prefill chunks in one step, and one
    chunk padded every decode to the prefill's 32-128 query rows on SDPA (measured on the AMX host,
    benchmarks/RESULTS.md issue 24, "Eighth round"). The floor keeps small mixed steps in one chunk as
    before, so their rows round as they did (speculation on and off give the same prompt log-probs)."""
    chunks: list[list[int]] = []
    q_max = l_max = real = 0
    for b in order:
        pairs = qlens[b] * lens[b]
        if chunks:
            n, qm, lm = len(chunks[-1]) + 1, max(q_max, qlens[b]), max(l_max, lens[b])
            waste = n * qm * lm - (real + pairs)
            if (
                n * lm * kv_token_bytes <= _KV_BUDGET
                and n * qm * lm <= _MASK_BUDGET
                and waste <= max(_PAD_WASTE * (real + pairs), _PAD_FLOOR)
            ):
                chunks[-1].append(b)
                q_max, l_max, real = qm, lm, real + pairs
                continue
        chunks.append([b])
        q_max, l_max, real = qlens[b], lens[b], pairs
    return chunks


def _chunk(
    chunk: list[int],
    tables: torch.Tensor,
    starts: list[int],
    qlens: list[int],
    lens: list[int],
    block_size: int,
) -> _Chunk:
    dev = tables.device
    n = len(chunk)
    q_max, l_max = max(qlens[b] for b in chunk), max(lens[b] for b in chunk)
    blocks = -(-l_max // block_size)
    length = blocks * block_size
    idx = torch.tensor(chunk, device=dev)
    seq = torch.tensor([lens[b] for b in chunk], device=dev)
    ql = torch.tensor([qlens[b] for b in chunk], device=dev)
    used = torch.arange(blocks, device=dev)[None, :] * block_size < seq[:, None]
    ids = torch.where(used, tables[idx, :blocks], 0).flatten()
    valid = torch.arange(length, device=dev)[None, :] < seq[:, None]  # [n, L]
    pad = (~valid).flatten().nonzero()[:, 0]
    offs = torch.arange(q_max, device=dev)
    q_ok = offs[None, :] < ql[:, None]  # [n, Qmax]
    first = torch.tensor([starts[b] for b in chunk], device=dev)
    rows = torch.where(q_ok, first[:, None] + offs[None, :], first[:, None]).flatten()
    causal = all(qlens[b] == lens[b] == q_max for b in chunk) and length == q_max
    mask = None
    if not causal:
        q_pos = (seq - ql)[:, None] + offs[None, :]  # [n, Qmax] context position of each query row
        seen = torch.arange(length, device=dev)[None, None, :] <= q_pos[:, :, None]
        mask = (seen & valid[:, None, :])[:, None]
    all_real = bool(q_ok.all())
    return _Chunk(
        ids,
        n,
        q_max,
        length,
        pad if pad.numel() else None,
        mask,
        causal,
        rows,
        None if all_real else q_ok.flatten(),
    )


def _plan(
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    block_size: int,
    kv_token_bytes: int,
    device: torch.device,
) -> list[_Chunk]:
    key = (block_size, kv_token_bytes, device.type, device.index or 0, _KV_BUDGET, _MASK_BUDGET)
    last: _Plan | None = getattr(_local, "plan", None)
    if last is not None and last.matches(key, block_tables, query_start_loc, seq_lens):
        return last.chunks
    starts = query_start_loc.tolist()
    lens = seq_lens.tolist()
    qlens = [starts[b + 1] - starts[b] for b in range(len(lens))]
    for b, (query_len, seq_len) in enumerate(zip(qlens, lens)):
        if query_len > seq_len:
            raise ValueError(f"request {b}: {query_len} queries but only {seq_len} context tokens")
    order = sorted((b for b in range(len(lens)) if qlens[b] > 0), key=lambda b: (qlens[b], lens[b]))
    tables = block_tables.to(device=device, dtype=torch.long)
    chunks = [
        _chunk(c, tables, starts, qlens, lens, block_size) for c in _split(order, qlens, lens, kv_token_bytes)
    ]
    _local.plan = _Plan(key, block_tables.clone(), query_start_loc.clone(), seq_lens.clone(), chunks)
    return chunks


def _gather(cache: torch.Tensor, c: _Chunk, name: str) -> torch.Tensor:
    """Chunk ``c``'s blocks of ``cache`` as a ``[n, Hkv, L, D]`` strided view of a scratch buffer."""
    block_size, heads, dim = cache.shape[1:]
    raw = scratch(name, (c.ids.numel(), block_size, heads, dim), cache.dtype, cache.device)
    torch.index_select(cache, 0, c.ids, out=raw)
    flat = raw.view(c.n * c.length, heads, dim)
    if c.pad is not None:
        flat.index_fill_(0, c.pad, 0.0)
    return flat.view(c.n, c.length, heads, dim).transpose(1, 2)


def _attend(
    q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, c: _Chunk, scale: float, out: torch.Tensor
) -> None:
    num_q_heads, head_dim = q.shape[1:]
    k = _gather(k_cache, c, "k")
    v = _gather(v_cache, c, "v")
    qc = q.index_select(0, c.rows).view(c.n, c.q_max, num_q_heads, head_dim).transpose(1, 2)
    if qc.dtype != k.dtype:
        qc = qc.to(k.dtype)
    if c.q_max == 1 and k.dtype != torch.float32 and c.n * c.length >= _MATH_MIN and not _sdpa_decodes():
        o = _single_query(qc, k, v, c.mask, scale)
    else:
        o = F.scaled_dot_product_attention(
            qc, k, v, attn_mask=c.mask, is_causal=c.causal, scale=scale, enable_gqa=num_q_heads != k.shape[1]
        )
    flat = o.transpose(1, 2).reshape(c.n * c.q_max, num_q_heads, head_dim).to(out.dtype)
    if c.keep is None:
        out.index_copy_(0, c.rows, flat)
    else:
        out[c.rows[c.keep]] = flat[c.keep]


def _single_query(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float
) -> torch.Tensor:
    """SDPA's result for one query row per request (``q`` ``[n, Hq, 1, D]``, K/V ``[n, Hkv, L, D]`` views
    of ``[n, L, Hkv, D]`` gathers, ``mask`` ``[n, 1, 1, L]`` True = attend): per KV head, its query heads
    are the rows of one batched matmul against that head's K, float32 scores and softmax, probabilities
    rounded to V's dtype for the second matmul. One KV head at a time because its K and V are strided
    views the batched matmul reads in place; all heads at once made the matmul copy K (float32) and V
    into [n * Hkv] batches first, a quarter of a decode step's attention (benchmarks/RESULTS.md issue 24)."""
    n, num_q_heads, _, dim = q.shape
    num_kv_heads = k.shape[1]
    grouped = q.reshape(n, num_kv_heads, num_q_heads // num_kv_heads, dim).float()
    if n < 2 or n * k.shape[2] < _PER_HEAD_MIN:  # little to copy: one matmul over all heads saves the loop
        scores = torch.matmul(grouped, k.float().transpose(-1, -2)).mul_(scale)
        if mask is not None:
            scores.masked_fill_(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        return torch.matmul(probs, v).view(n, num_q_heads, 1, dim)
    keys = k.transpose(1, 2).float()  # [n, L, Hkv, D]: one conversion pass over the gathered K
    values = v.transpose(1, 2)
    hidden = None if mask is None else ~mask[:, 0]  # [n, 1, L]
    out = torch.empty(n, num_kv_heads, grouped.shape[2], dim, dtype=v.dtype, device=v.device)
    for h in range(num_kv_heads):
        scores = torch.bmm(grouped[:, h], keys[:, :, h].transpose(1, 2)).mul_(scale)
        if hidden is not None:
            scores.masked_fill_(hidden, float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(v.dtype)
        out[:, h] = torch.bmm(probs, values[:, :, h])
    return out.view(n, num_q_heads, 1, dim)


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
    block_size, num_kv_heads, head_dim = k_cache.shape[1:]
    if num_q_heads % num_kv_heads:
        raise ValueError(f"query heads {num_q_heads} not a multiple of kv heads {num_kv_heads}")
    kv_token_bytes = 2 * num_kv_heads * head_dim * k_cache.element_size()
    chunks = _plan(block_tables, query_start_loc, seq_lens, block_size, kv_token_bytes, k_cache.device)
    out = torch.empty_like(q)
    for c in chunks:
        _attend(q, k_cache, v_cache, c, scale, out)
    return out
