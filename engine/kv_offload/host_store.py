"""The host tier's memory on one rank, and the block copies of a ``CopyPlan``.

Layout: the device cache is one tensor ``[layers, 2, blocks, block_size, kv_heads, head_dim]`` (what
the attention kernels index per layer). The host store is ``[host_blocks, layers, 2, block_size,
kv_heads, head_dim]``: one host block, across all layers and both K and V, is one contiguous range of
``block_bytes``. An offload of n blocks is one gather kernel on the device (``index_select`` over the
block axis, then the block-major permute) into a contiguous staging buffer and then n contiguous
copies of ``block_bytes`` each (2 MiB per block for Llama-3.1-8B in bf16), never ``2 x layers``
strided pieces per block; a reload is the reverse (n contiguous copies, one scatter kernel). On CUDA
the host store is pinned and the copies run on a side stream: the stream first waits for the work
already queued (the previous step wrote these blocks), and the step's forward pass waits on the
copies' event, so only a step that has copies waits for them, and the host prepares the step
meanwhile. On the CPU it is plain memory and the copies are synchronous.
"""

from __future__ import annotations

import torch

from prefixflow.engine.kv_offload.copy_plan import CopyPlan
from prefixflow.engine.kv_offload.disk_store import DiskKVStore
from prefixflow.engine.kv_offload.disk_tier import digest_of

CHUNK_BLOCKS = 64  # staging bound: at most this many blocks' bytes of extra device memory per copy


class HostKVStore:
    def __init__(self, kv_cache: torch.Tensor, num_host_blocks: int) -> None:
        self.kv_cache = kv_cache
        self.device = kv_cache.device
        layers, two, _, bs, heads, dim = kv_cache.shape
        cuda = self.device.type == "cuda"
        self.host = torch.zeros(
            (num_host_blocks, layers, two, bs, heads, dim), dtype=kv_cache.dtype, pin_memory=cuda
        )
        self.stream = torch.cuda.Stream(self.device) if cuda else None  # type: ignore[no-untyped-call]
        self.copies = 0  # contiguous block transfers issued (for tests and the bandwidth check)
        self.disk: DiskKVStore | None = None  # kv_cache_dir: the writer of a plan's persists

    @property
    def num_blocks(self) -> int:
        return int(self.host.shape[0])

    @torch.inference_mode()
    def apply(self, plan: CopyPlan) -> None:
        if self.stream is None:
            self._run(plan)
            return
        main = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(main)  # the blocks were written by work already on the main stream
        with torch.cuda.stream(self.stream):
            self._run(plan)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(self.stream)
        main.wait_event(done)  # this step's forward reads (reloads) or overwrites (offloads) them

    def quiesce(self) -> None:
        """Wait for the side stream's copies: the host memory is about to be written from the CPU."""
        if self.stream is not None:
            self.stream.synchronize()

    def _run(self, plan: CopyPlan) -> None:
        if self.disk is not None:
            for start in range(0, len(plan.persist), CHUNK_BLOCKS):
                self._persist(plan.persist[start : start + CHUNK_BLOCKS])
        for part in _chunks(plan.offload):
            self._offload(part)
        for part in _chunks(plan.reload):
            self._reload(part)
        if plan.local:
            self._local(plan.local)

    def _ids(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def _offload(self, pairs: list[tuple[int, int]]) -> None:
        dev = self._ids([d for d, _ in pairs])
        staged = self.kv_cache.index_select(2, dev).permute(2, 0, 1, 3, 4, 5).contiguous()
        for i, (_, h) in enumerate(pairs):  # one contiguous block_bytes copy per block
            self.host[h].copy_(staged[i], non_blocking=self.stream is not None)
            self.copies += 1
        if self.stream is not None:
            staged.record_stream(self.stream)

    def _persist(self, entries: list[tuple[int, int, int]]) -> None:
        """Stage computed prompt blocks for the disk writer, block-major like the host store."""
        assert self.disk is not None
        dev = self._ids([d for d, _, _ in entries])
        staged = self.kv_cache.index_select(2, dev).permute(2, 0, 1, 3, 4, 5).contiguous()
        ready = None
        if self.stream is not None:
            cpu = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
            cpu.copy_(staged, non_blocking=True)
            staged.record_stream(self.stream)
            ready = torch.cuda.Event()  # type: ignore[no-untyped-call]
            ready.record(self.stream)
            staged = cpu
        self.disk.persist([digest_of(hi, lo) for _, hi, lo in entries], staged, ready)

    def _reload(self, pairs: list[tuple[int, int]]) -> None:
        dev = self._ids([d for _, d in pairs])
        if self.stream is None:
            staged = self.host[torch.tensor([h for h, _ in pairs])]
            self.copies += 1
        else:
            staged = torch.empty(
                (len(pairs), *self.host.shape[1:]), dtype=self.host.dtype, device=self.device
            )
            for i, (h, _) in enumerate(pairs):
                staged[i].copy_(self.host[h], non_blocking=True)
                self.copies += 1
            staged.record_stream(self.stream)
        self.kv_cache.index_copy_(2, dev, staged.permute(1, 2, 0, 3, 4, 5))

    def _local(self, pairs: list[tuple[int, int]]) -> None:
        """Copy-on-write of partial blocks, in order: a target may be the next pair's source."""
        targets = {d for _, d in pairs}
        if any(s in targets for s, _ in pairs):
            for s, d in pairs:
                self.kv_cache[:, :, d] = self.kv_cache[:, :, s]
            return
        src, dst = self._ids([s for s, _ in pairs]), self._ids([d for _, d in pairs])
        self.kv_cache.index_copy_(2, dst, self.kv_cache.index_select(2, src))


def _chunks(pairs: list[tuple[int, int]]) -> list[list[tuple[int, int]]]:
    return [pairs[i : i + CHUNK_BLOCKS] for i in range(0, len(pairs), CHUNK_BLOCKS)]
