"""CUDA graphs for decode-only steps, over bucketed batch sizes.

A decode step's shapes depend only on the batch size, so one graph per bucket replays the whole
forward pass with a single launch. Batches are padded up to the bucket: padded rows store nothing
(slot -1) and attend over one dummy token, so they cost a little compute and change no real row.
Without CUDA (or with ``capture=False``) the same padded buffers run eagerly, which is how the CPU
tests check the padding is harmless.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from prefixflow.engine.attention import AttentionMetadata
from prefixflow.engine.models.llama import StepContext

log = logging.getLogger(__name__)


def bucket_sizes(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_batch + 1, 16))
    return sorted({s for s in sizes if s <= max_batch} | {max_batch})


class DecodeGraphs:
    def __init__(self, runner, max_batch: int, max_blocks_per_seq: int, capture: bool) -> None:
        self.runner = runner
        self.buckets = bucket_sizes(max_batch)
        dev = runner.device
        self.ids = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.slots = torch.full((max_batch,), -1, dtype=torch.long, device=dev)
        self.tables = torch.zeros((max_batch, max_blocks_per_seq), dtype=torch.int32, device=dev)
        self.starts = torch.arange(max_batch + 1, dtype=torch.int32, device=dev)
        self.seq_lens = torch.ones(max_batch, dtype=torch.int32, device=dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def bucket_for(self, batch: int) -> int | None:
        return next((b for b in self.buckets if b >= batch), None)

    def _forward(self, b: int) -> torch.Tensor:
        meta = AttentionMetadata(
            self.slots[:b], self.tables[:b], self.starts[: b + 1], self.seq_lens[:b], 1, self.tables.shape[1]
        )
        ctx = StepContext(self.positions[:b], meta, self.runner.attention, self.runner.cos_sin_cache)
        return self.runner.model(self.ids[:b], ctx, self.runner.kv_caches)

    @torch.inference_mode()
    def _capture_all(self) -> None:
        pool = None
        try:
            for b in reversed(self.buckets):
                for _ in range(2):  # warm up (Triton autotune / compilation) outside the graph
                    self._forward(b)
                torch.cuda.synchronize()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool):
                    self.outputs[b] = self._forward(b)
                pool = graph.pool()
                self.graphs[b] = graph
        except Exception as exc:  # capture is an optimisation: never let it stop the engine
            log.warning("CUDA graph capture failed (%s); decode steps run eagerly", exc)
            self.graphs.clear()
            self.outputs.clear()

    @torch.inference_mode()
    def run(
        self, token_ids: np.ndarray, positions: np.ndarray, slots: np.ndarray, tables, seq_lens
    ) -> torch.Tensor:
        """Hidden states [batch, hidden] of a decode-only step."""
        b = len(token_ids)
        bucket = self.bucket_for(b)
        self.ids[:b].copy_(torch.from_numpy(token_ids))
        self.positions[:b].copy_(torch.from_numpy(positions))
        self.slots[:b].copy_(torch.from_numpy(slots))
        self.slots[b:bucket].fill_(-1)
        self.seq_lens[:b].copy_(torch.from_numpy(seq_lens))
        self.seq_lens[b:bucket].fill_(1)
        width = tables.shape[1]
        self.tables[:b, :width].copy_(torch.from_numpy(tables))
        self.tables[b:bucket].zero_()
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.outputs[bucket][:b]
        return self._forward(bucket)[:b]
