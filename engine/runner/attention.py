"""Attention backends: what a paged attention implementation owns, behind one small interface.

A backend builds its own per-step metadata from the flat step (``build_metadata``), owns the static
buffers a CUDA-graph decode step reads (``make_decode_buffers``), and runs store + attend
(``forward``). The model runner and the decode graphs only call these three, so a new backend (a
FlashInfer-style planner, say) needs no edit to model_shard.py or decode_graphs.py. Metadata is
opaque to the model: layers hand it back to the backend that made it. There is no global forward
context.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import cast

import numpy as np
import torch

from prefixflow.engine.runner.step_inputs import StepInputs, block_table_array
from prefixflow.kernels import KernelBackend


@dataclass(frozen=True)
class AttentionMetadata:
    """Flat varlen description of one step for the paged backend: request b owns query rows
    ``query_start_loc[b]:[b+1]``, which are the last positions of its ``seq_lens[b]``-token context."""

    slot_mapping: torch.Tensor  # [T] int64, -1 = do not store
    block_tables: torch.Tensor  # [B, max_blocks] int32
    query_start_loc: torch.Tensor  # [B + 1] int32
    seq_lens: torch.Tensor  # [B] int32
    max_query_len: int
    max_seq_len: int


class DecodeBuffers(ABC):
    """Static device buffers a captured decode graph reads its attention metadata from."""

    @abstractmethod
    def fill(self, step: StepInputs, bucket: int) -> None:
        """Copy a decode-only step of ``len(step.seq_lens) <= bucket`` requests in; pad the rest."""

    @abstractmethod
    def metadata(self, bucket: int) -> object:
        """Metadata viewing the buffers for a batch of ``bucket`` rows (same tensors every call)."""


class AttentionBackend(ABC):
    name: str

    @abstractmethod
    def build_metadata(self, step: StepInputs, device: torch.device) -> object:
        """This step's metadata, on ``device``."""

    @abstractmethod
    def make_decode_buffers(
        self, max_batch: int, max_blocks_per_seq: int, device: torch.device
    ) -> DecodeBuffers: ...

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: object,
        scale: float,
    ) -> torch.Tensor:
        """Store the new K/V into the cache, then attend over each request's whole context."""


class PagedAttention(AttentionBackend):
    """The kernels layer's ``store_kv`` + ``paged_attention`` over block tables."""

    def __init__(self, ops: KernelBackend) -> None:
        self.ops = ops
        self.name = f"paged-{ops.name}"

    def build_metadata(self, step: StepInputs, device: torch.device) -> AttentionMetadata:
        starts = step.query_start_loc
        return AttentionMetadata(
            slot_mapping=torch.from_numpy(step.slot_mapping).to(device),
            block_tables=torch.from_numpy(block_table_array(step.block_tables)).to(device),
            query_start_loc=torch.from_numpy(starts).to(device),
            seq_lens=torch.from_numpy(step.seq_lens).to(device),
            max_query_len=int((starts[1:] - starts[:-1]).max()),
            max_seq_len=int(step.seq_lens.max()),
        )

    def make_decode_buffers(
        self, max_batch: int, max_blocks_per_seq: int, device: torch.device
    ) -> DecodeBuffers:
        return PagedDecodeBuffers(max_batch, max_blocks_per_seq, device)

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: object,
        scale: float,
    ) -> torch.Tensor:
        m = cast(AttentionMetadata, meta)
        self.ops.store_kv(k, v, k_cache, v_cache, m.slot_mapping)
        return self.ops.paged_attention(
            q, k_cache, v_cache, m.block_tables, m.query_start_loc, m.seq_lens, scale
        )


class PagedDecodeBuffers(DecodeBuffers):
    """Padded rows store nothing (slot -1) and attend over one dummy token, so they change no real row."""

    def __init__(self, max_batch: int, max_blocks_per_seq: int, device: torch.device) -> None:
        self.slots = torch.full((max_batch,), -1, dtype=torch.long, device=device)
        self.tables = torch.zeros((max_batch, max_blocks_per_seq), dtype=torch.int32, device=device)
        self.starts = torch.arange(max_batch + 1, dtype=torch.int32, device=device)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=device)

    def fill(self, step: StepInputs, bucket: int) -> None:
        b = len(step.seq_lens)
        self.slots[:b].copy_(torch.from_numpy(step.slot_mapping))
        self.slots[b:bucket].fill_(-1)
        self.seq_lens[:b].copy_(torch.from_numpy(step.seq_lens))
        self.seq_lens[b:bucket].fill_(1)
        tables: np.ndarray = block_table_array(step.block_tables)
        self.tables[:b, : tables.shape[1]].copy_(torch.from_numpy(tables))
        self.tables[b:bucket].zero_()

    def metadata(self, bucket: int) -> AttentionMetadata:
        return AttentionMetadata(
            self.slots[:bucket],
            self.tables[:bucket],
            self.starts[: bucket + 1],
            self.seq_lens[:bucket],
            1,
            self.tables.shape[1],
        )


def make_attention_backend(ops: KernelBackend) -> AttentionBackend:
    """The backend the engine runs; a new backend is chosen here, nowhere else."""
    return PagedAttention(ops)
