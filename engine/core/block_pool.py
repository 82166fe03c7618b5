"""Fixed-size KV blocks with reference counts, an LRU free queue and the prefix-hash index.

A block whose reference count drops to zero goes to the free queue but keeps its hash, so a later
request can still find it; it is only forgotten when the pool hands it out again (LRU eviction).
Blocks that were never hashed are handed out first, since nobody can hit them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from prefixflow.engine.core.partial_index import PartialIndex


def chain_hash(parent: int | None, token_ids: Sequence[int]) -> int:
    """Deterministic across processes: Python hashes int tuples without a per-process salt."""
    return hash((parent if parent is not None else -1, tuple(token_ids)))


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: int | None = None
    key: tuple[int | None, tuple[int, ...]] | None = None  # (parent hash, token ids): the collision guard


class BlockPool:
    def __init__(self, num_blocks: int, enable_caching: bool = True) -> None:
        self.blocks = [Block(i) for i in range(num_blocks)]
        self.free: OrderedDict[int, None] = OrderedDict((i, None) for i in range(num_blocks))
        self.cached: dict[int, int] = {}
        self.enable_caching = enable_caching
        self.evictions = 0
        self.num_free_cached = 0  # free blocks that still hold a findable prefix
        self.on_evict: Callable[[Block], None] | None = None  # sees a cached block before it is reused
        self.partial = PartialIndex()  # token-granular sharing: blocks by the token run they hold

    @property
    def num_free_uncached(self) -> int:
        """Free blocks that can be handed out without evicting any cached prefix."""
        return len(self.free) - self.num_free_cached

    @property
    def num_free(self) -> int:
        return len(self.free)

    def allocate(self) -> Block:
        if not self.free:
            raise RuntimeError("KV block pool exhausted (scheduler must check capacity first)")
        block_id, _ = self.free.popitem(last=False)
        return self._hand_out(self.blocks[block_id])

    def take(self, block: Block) -> Block:
        """Hand out this free block (a shared partial block its new owner continues in place)."""
        del self.free[block.block_id]
        return self._hand_out(block)

    def _hand_out(self, block: Block) -> Block:
        self.partial.drop(block.block_id)
        if block.block_hash is not None:
            if self.on_evict is not None:
                self.on_evict(block)
            self.cached.pop(block.block_hash, None)
            block.block_hash, block.key = None, None
            self.evictions += 1
            self.num_free_cached -= 1
        block.ref_count = 1
        return block

    def lookup(self, parent: int | None, token_ids: Sequence[int]) -> Block | None:
        if not self.enable_caching:
            return None
        h = chain_hash(parent, token_ids)
        block_id = self.cached.get(h)
        if block_id is None:
            return None
        block = self.blocks[block_id]
        if block.key != (parent, tuple(token_ids)):
            return None  # hash collision: never reuse a block whose contents differ
        return block

    def acquire(self, block: Block) -> None:
        """Take a reference on a cached block (removing it from the free queue if idle)."""
        if block.ref_count == 0:
            del self.free[block.block_id]
            self.num_free_cached -= 1  # only hashed blocks can be hit
        block.ref_count += 1

    def register(self, block: Block, parent: int | None, token_ids: Sequence[int]) -> int:
        """Record a now-full block under its chained hash and return the hash."""
        h = chain_hash(parent, token_ids)
        if self.enable_caching and h not in self.cached:
            block.block_hash, block.key = h, (parent, tuple(token_ids))
            self.cached[h] = block.block_id
        return h

    def release(self, block: Block) -> None:
        if block.ref_count <= 0:
            raise RuntimeError(f"double free of block {block.block_id}")
        block.ref_count -= 1
        if block.ref_count == 0:
            self.free[block.block_id] = None
            if block.block_hash is None:
                self.free.move_to_end(block.block_id, last=False)  # reuse unhashed blocks first
            else:
                self.num_free_cached += 1
