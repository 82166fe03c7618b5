"""One rank's side of the persistent KV tier: block files written in the background, read into the
host store on request, and the directory kept under its size cap.

Writes leave the step at once: the step's copy plan gathers the blocks into a CPU (pinned on CUDA)
staging tensor, in plan order before anything can overwrite them, and a single writer thread waits
for that copy's event and writes the files. Pending writes are bounded (``MAX_PENDING_BYTES``); past
that a block is not written (counted in ``dropped``), never the step delayed. Reads are synchronous
(the scheduler needs the answer): each block is read, checked and copied into its host block, in
order, stopping at the first miss.

The cap: the directory's size is measured when the store opens and again whenever this rank has
written a sixteenth of the cap since, or its estimate passes the cap; then the least recently used
files (modification time, refreshed by every read) go. Several engines on one directory each
enforce the same cap, so it holds to within a sixteenth of the cap per writing engine.
"""

from __future__ import annotations

import threading
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch

from prefixflow.engine.kv_offload import disk_files

MAX_PENDING_BYTES = 256 * 1024**2  # staged blocks waiting for the writer; past it, blocks are not persisted
RESCAN_FRACTION = 16


@dataclass
class DiskCounters:
    written_blocks: int = 0
    written_bytes: int = 0
    skipped_blocks: int = 0  # already on disk (another engine wrote it first)
    dropped_blocks: int = 0  # not written: too many pending, or a write failed
    read_blocks: int = 0
    read_bytes: int = 0
    missing_blocks: int = 0  # gone between the scheduler's look and the read (evicted by another engine)
    corrupt_blocks: int = 0  # failed the checks: removed and recomputed


class DiskKVStore:
    def __init__(self, root: Path, namespace: bytes, rank: int, cap_bytes: int, block_bytes: int) -> None:
        self.root = root
        self.namespace = namespace
        self.folder = root / namespace.hex()
        self.rank = rank
        self.cap_bytes = cap_bytes
        self.block_bytes = block_bytes
        self.counters = DiskCounters()
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._pending_bytes = 0
        self._since_scan = 0
        self._size = 0
        self._warned = False
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="prefixflow-kv-disk")
        self._futures: list[Future[None]] = [self._writer.submit(self._scan)]

    def path(self, digest: bytes) -> Path:
        return disk_files.block_path(self.folder, digest, self.rank)

    def persist(self, digests: list[bytes], staged: torch.Tensor, ready: torch.cuda.Event | None) -> None:
        """Write block i of ``staged`` (``[n, ...]`` on the CPU) as ``digests[i]`` once ``ready`` fired."""
        size = staged.numel() * staged.element_size()
        with self._lock:
            if self._pending_bytes + size > MAX_PENDING_BYTES:
                self.counters.dropped_blocks += len(digests)
                return
            self._pending_bytes += size
            self._futures = [f for f in self._futures if not f.done()]
            self._futures.append(self._writer.submit(self._write, digests, staged, ready, size))

    def _write(
        self, digests: list[bytes], staged: torch.Tensor, ready: torch.cuda.Event | None, size: int
    ) -> None:
        try:
            if ready is not None:
                ready.synchronize()
            raw = staged.reshape(len(digests), -1).view(torch.uint8).numpy()
            for i, digest in enumerate(digests):
                path = self.path(digest)
                if path.exists():
                    self.counters.skipped_blocks += 1
                    continue
                try:
                    written = disk_files.write_block(path, self.namespace, digest, memoryview(raw[i]))
                except OSError as exc:  # a full or read-only disk: the tier stops mattering, the job goes on
                    with self._lock:
                        self.counters.dropped_blocks += 1
                    self._warn(
                        f"KV cache dir {self.root}: a block write failed ({exc}); blocks are recomputed instead"
                    )
                    continue
                self.counters.written_blocks += 1
                self.counters.written_bytes += written
                self._size += written
                self._since_scan += written
            if self._size > self.cap_bytes or self._since_scan * RESCAN_FRACTION > self.cap_bytes:
                self._scan()
        finally:
            with self._lock:
                self._pending_bytes -= size

    def _scan(self) -> None:
        self._size = disk_files.enforce_cap(self.root, self.cap_bytes)
        self._since_scan = 0

    def _warn(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            warnings.warn(message, RuntimeWarning, stacklevel=2)

    def load(self, entries: list[tuple[bytes, int]], host: torch.Tensor) -> int:
        """Read ``(digest, host block)`` pairs into ``host`` in order; returns how many loaded (the
        first miss or corrupt file ends the run)."""
        for n, (digest, host_id) in enumerate(entries):
            buf, problem = disk_files.read_block(self.path(digest), self.namespace, digest, self.block_bytes)
            if problem is not None:
                if problem == "missing":
                    self.counters.missing_blocks += 1
                else:
                    self.counters.corrupt_blocks += 1
                    self._warn(
                        f"KV cache dir {self.root}: {self.path(digest).name} {problem}; removed, recomputing"
                    )
                return n
            payload = torch.frombuffer(
                buf, dtype=torch.uint8, offset=disk_files.HEADER.size, count=self.block_bytes
            )
            host[host_id].view(-1).view(torch.uint8).copy_(payload)
            self.counters.read_blocks += 1
            self.counters.read_bytes += len(buf)
        return len(entries)

    def flush(self) -> None:
        """Wait until every block handed to the writer is on disk (or dropped)."""
        with self._lock:
            futures, self._futures = self._futures, []
        for f in futures:
            f.result()

    def close(self) -> None:
        self.flush()
        self._writer.shutdown(wait=True)
