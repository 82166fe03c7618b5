"""The host tier's bookkeeping: which host block holds which prefix block, and which goes next.

Host blocks are indexed by the same chained block hash as the device prefix cache and guarded the
same way (the (parent hash, token ids) key is compared on every hit). The tier is inclusive: a block
reloaded to the device keeps its host copy, so evicting it from the device again costs no copy.
Eviction is LRU over the host blocks no pending reload reads (a pinned block is not in the queue).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from prefixflow.engine.core.block_pool import chain_hash

Key = tuple[int | None, tuple[int, ...]]


@dataclass
class HostBlock:
    host_id: int
    pins: int = 0
    block_hash: int | None = None
    key: Key | None = None


class HostBlockPool:
    def __init__(self, num_blocks: int) -> None:
        self.blocks = [HostBlock(i) for i in range(num_blocks)]
        self.lru: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))  # oldest first
        self.cached: dict[int, int] = {}
        self.evictions = 0

    @property
    def num_blocks(self) -> int:
        return len(self.blocks)

    def lookup(self, parent: int | None, token_ids: Sequence[int]) -> HostBlock | None:
        block_id = self.cached.get(chain_hash(parent, token_ids))
        if block_id is None:
            return None
        block = self.blocks[block_id]
        return block if block.key == (parent, tuple(token_ids)) else None

    def touch(self, block: HostBlock) -> None:
        if block.pins == 0:
            self.lru.move_to_end(block.host_id)

    def store(self, block_hash: int, key: Key) -> HostBlock | None:
        """A host block to copy a device block into, or None: already held (the LRU is refreshed) or
        every host block is pinned by a pending reload (the device block is then simply dropped)."""
        held = self.cached.get(block_hash)
        if held is not None:
            self.touch(self.blocks[held])
            return None
        if not self.lru:
            return None
        host_id, _ = self.lru.popitem(last=False)
        block = self.blocks[host_id]
        if block.block_hash is not None:
            del self.cached[block.block_hash]
            self.evictions += 1
        block.block_hash, block.key = block_hash, key
        self.cached[block_hash] = host_id
        self.lru[host_id] = None
        return block

    def pin(self, block: HostBlock) -> None:
        """A reload reads this block this step: it must not be overwritten before the copy ran."""
        if block.pins == 0:
            del self.lru[block.host_id]
        block.pins += 1

    def forget(self, block: HostBlock) -> None:
        """A pinned block ``store`` handed out whose contents never arrived (a failed disk read):
        unindex it and make it the next one reused."""
        if block.block_hash is not None:
            self.cached.pop(block.block_hash, None)
        block.block_hash, block.key = None, None
        self.unpin(block)
        self.lru.move_to_end(block.host_id, last=False)

    def unpin(self, block: HostBlock) -> None:
        if block.pins <= 0:
            raise RuntimeError(f"host block {block.host_id} unpinned more often than pinned")
        block.pins -= 1
        if block.pins == 0:
            self.lru[block.host_id] = None  # most recently used: it was just reloaded
