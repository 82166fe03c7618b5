"""CUDA graphs for decode-only steps, over bucketed batch sizes.

A decode step's shapes depend only on the batch size, so one graph per bucket replays the whole
forward pass with a single launch. Batches are padded up to the bucket; the attention backend owns
its metadata buffers and their padding (``AttentionBackend.make_decode_buffers``), this class only
the token ids and positions. Without CUDA (or with ``capture=False``) the same padded buffers run
eagerly, which is how the CPU tests check the padding is harmless.
"""

from __future__ import annotations

import logging

import torch
from torch import nn

from prefixflow.engine.models.llama import KVCache, StepContext
from prefixflow.engine.runner.attention import AttentionBackend
from prefixflow.engine.runner.step_inputs import StepInputs

log = logging.getLogger(__name__)


def bucket_sizes(max_batch: int) -> list[int]:
    sizes = [1, 2, 4, 8] + list(range(16, max_batch + 1, 16))
    return sorted({s for s in sizes if s <= max_batch} | {max_batch})


class DecodeGraphs:
    def __init__(
        self,
        model: nn.Module,
        attention: AttentionBackend,
        kv_caches: list[KVCache],
        cos_sin_cache: torch.Tensor,
        max_batch: int,
        max_blocks_per_seq: int,
        capture: bool,
    ) -> None:
        self.model, self.kv_caches, self.cos_sin_cache = model, kv_caches, cos_sin_cache
        self.buckets = bucket_sizes(max_batch)
        dev = cos_sin_cache.device
        self.ids = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.positions = torch.zeros(max_batch, dtype=torch.long, device=dev)
        self.attn_buffers = attention.make_decode_buffers(max_batch, max_blocks_per_seq, dev)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    def bucket_for(self, batch: int) -> int | None:
        return next((b for b in self.buckets if b >= batch), None)

    def _forward(self, b: int) -> torch.Tensor:
        ctx = StepContext(self.positions[:b], self.attn_buffers.metadata(b), self.cos_sin_cache)
        hidden: torch.Tensor = self.model(self.ids[:b], ctx, self.kv_caches)
        return hidden

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
    def run(self, step: StepInputs) -> torch.Tensor:
        """Hidden states [batch, hidden] of a decode-only step."""
        b = len(step.token_ids)
        bucket = self.bucket_for(b)
        assert bucket is not None, f"decode batch {b} is above the largest graph bucket"
        self.ids[:b].copy_(torch.from_numpy(step.token_ids))
        self.positions[:b].copy_(torch.from_numpy(step.positions))
        self.attn_buffers.fill(step, bucket)
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.outputs[bucket][:b]
        return self._forward(bucket)[:b]
