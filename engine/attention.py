"""The per-step attention inputs and the backend that consumes them.

The model runner builds one ``AttentionMetadata`` per step and passes it down explicitly; there is
no global forward context. Backends (torch reference, Triton) share the ``kernels`` interface.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class AttentionMetadata:
    """Flat varlen description of one step: request b owns query rows ``query_start_loc[b]:[b+1]``,
    which are the last positions of its ``seq_lens[b]``-token context."""

    slot_mapping: torch.Tensor  # [T] int64, -1 = do not store
    block_tables: torch.Tensor  # [B, max_blocks] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    max_query_len: int
    max_seq_len: int


class AttentionBackend:
    """Stores new K/V into the paged cache, then attends over each request's whole context."""

    def __init__(self, name: str, device: torch.device) -> None:
        from prefixflow import kernels
        self.ops = kernels.select(name, device)
        self.name = name

    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        self.ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping)
        return self.ops.paged_attention(
            q, k_cache, v_cache, meta.block_tables, meta.query_start_loc, meta.seq_lens, scale
        )
