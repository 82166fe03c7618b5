"""Per-request block tables on top of the block pool, including prefix-cache hits.

The manager owns every request's block table and block hashes (keyed by ``Request.key``); it reads
requests but never writes them. Capacity checks happen here so the scheduler never asks the pool for
a block it does not have.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from prefixflow.engine.core.block_pool import Block, BlockPool
from prefixflow.engine.core.request import Request
from prefixflow.engine.kv_offload.copy_plan import CopyPlan
from prefixflow.engine.kv_offload.cost_model import CostModel
from prefixflow.engine.kv_offload.host_pool import HostBlock
from prefixflow.engine.kv_offload.tier import HostTier


@dataclass
class BlockTable:
    """The blocks one running request holds, in token order, and the hashes of its full ones."""

    block_ids: list[int] = field(default_factory=list)
    block_hashes: list[int] = field(default_factory=list)
    disk_digests: list[bytes] = field(default_factory=list)  # the disk tier's chain (kv_offload/disk_tier.py)


@dataclass(frozen=True)
class CachedPrefix:
    """The longest run of cached full blocks a waiting request can map in: device blocks, then the
    host blocks that continue the run (reloaded on admission). ``hashes`` covers both."""

    blocks: list[Block]
    hashes: list[int]
    host: list[HostBlock] = field(default_factory=list)
    partial_block: int | None = None  # a device block whose first ``partial_tokens`` tokens continue the run
    partial_tokens: int = 0
    disk_digests: list[bytes] = field(
        default_factory=list
    )  # computed by a disk-tier lookup, reused on admission

    def __len__(self) -> int:
        return len(self.hashes)

    def tokens(self, block_size: int) -> int:
        """Prompt tokens this prefix covers: its full blocks plus the shared part of the next one."""
        return len(self.hashes) * block_size + self.partial_tokens

    @property
    def num_device(self) -> int:
        return len(self.blocks)


class KVCacheManager:
    """``host_blocks`` > 0 adds the host tier (kv_offload/): evicted prefix blocks are offloaded
    there and reloaded on a later hit when ``cost`` says a reload beats recompute (no ``cost``: always).
    The copies a step needs are collected in a plan the engine takes with ``take_copies``."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        enable_caching: bool = True,
        reserve_output_blocks: int = 4,
        host_blocks: int = 0,
        cost: CostModel | None = None,
    ) -> None:
        self.block_size = block_size
        self.reserve_output_blocks = reserve_output_blocks
        self.pool = BlockPool(num_blocks, enable_caching)
        self._tables: dict[int, BlockTable] = {}
        self.share_partial_blocks = True  # token-granular sharing (partial_index.py); off = block-granular
        self._plan = CopyPlan()
        self.host: HostTier | None = None
        if host_blocks > 0 and enable_caching:
            tier = self.host = HostTier(host_blocks, cost)
            self.pool.on_evict = lambda block: tier.offload(block, self._plan)

    def take_copies(self) -> CopyPlan:
        """The block copies the step just scheduled needs before its forward pass (see CopyPlan)."""
        plan, self._plan = self._plan, CopyPlan()
        if self.host is not None:
            self.host.copies_planned()
        return plan

    @property
    def num_blocks(self) -> int:
        return len(self.pool.blocks)

    @property
    def caching_enabled(self) -> bool:
        return self.pool.enable_caching

    @property
    def num_free_uncached_blocks(self) -> int:
        """Free blocks that can be handed out without evicting any cached prefix."""
        return self.pool.num_free_uncached

    def block_table(self, req: Request) -> list[int]:
        """The block ids ``req`` holds (empty when it holds none); read-only for callers."""
        table = self._tables.get(req.key)
        return table.block_ids if table is not None else []

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, req: Request) -> CachedPrefix:
        """Longest run of cached full blocks, within ``req.max_cache_hit_tokens``."""
        if not self.pool.enable_caching:
            return CachedPrefix([], [])
        bs = self.block_size
        hits: list[Block] = []
        hashes: list[int] = []
        parent = None
        for i in range(req.max_cache_hit_tokens // bs):
            tokens = req.token_ids[i * bs : (i + 1) * bs]
            block = self.pool.lookup(parent, tokens)
            if block is None:
                break
            hits.append(block)
            parent = block.block_hash
            assert parent is not None  # a block found by lookup is hashed
            hashes.append(parent)
        host: list[HostBlock] = []
        digests: list[bytes] = []
        limit = req.max_cache_hit_tokens // bs
        if self.host is not None and len(hits) < limit:
            host = self.host.continue_prefix(req.token_ids, parent, len(hits), limit, bs, self._plan, digests)
            hashes.extend(h.block_hash for h in host if h.block_hash is not None)
        start = len(hashes) * bs
        if not self.share_partial_blocks:
            return CachedPrefix(hits, hashes, host, disk_digests=digests)
        shared = self.pool.partial.best(
            hashes[-1] if hashes else None,
            req.token_ids[start : start + bs],
            req.max_cache_hit_tokens - start,
        )
        if shared is None or shared[1] == 0:
            return CachedPrefix(hits, hashes, host, disk_digests=digests)
        return CachedPrefix(hits, hashes, host, shared[0], shared[1], digests)

    def blocks_reserved(self, req: Request) -> int:
        """Blocks a running request is still promised (see ``reservation_tokens``) but does not hold."""
        return max(0, self._blocks_for(self.reservation_tokens(req)) - len(self.block_table(req)))

    def blocks_for_reservation(self, req: Request) -> int:
        return self._blocks_for(self.reservation_tokens(req))

    def reservation_tokens(self, req: Request) -> int:
        """Prompt plus the output a request will probably write, capped at a few blocks: enough that
        short-output jobs (labeling, chat turns) never preempt, without reserving for max_model_len."""
        ahead = min(req.max_tokens, self.reserve_output_blocks * self.block_size)
        return min(req.num_tokens + max(ahead, 1), req.max_total_tokens + 1)

    def admit(
        self,
        req: Request,
        prefix: CachedPrefix,
        num_new_tokens: int,
        reserved: int | None = None,
    ) -> bool:
        """Give a waiting request its cached prefix plus room for ``num_new_tokens``; False if it won't fit.

        With ``reserved`` (blocks already promised to running prefills), the request must also fit
        its whole prompt plus a decode token: admitting a prompt the pool cannot finish only leads
        to preempting it, or someone else, and computing it again.
        """
        idle_hits = sum(1 for b in prefix.blocks if b.ref_count == 0)
        source = self.pool.blocks[prefix.partial_block] if prefix.partial_block is not None else None
        cached = prefix.tokens(self.block_size)
        need = self._blocks_for(cached + num_new_tokens) - prefix.num_device  # host hits need device blocks
        if reserved is not None:
            whole = self._blocks_for(self.reservation_tokens(req)) - prefix.num_device
            if whole + idle_hits + reserved > self.pool.num_free:
                return False
        if need + idle_hits > self.pool.num_free:
            return False
        for block in prefix.blocks:
            self.pool.acquire(block)
        if self.host is not None and prefix.host:
            self.host.pin(prefix.host)  # allocating below may offload, which must not overwrite these
        own: list[int] = []
        if source is not None and source.ref_count == 0:
            # nobody holds the shared block: continue in it (no copy; a hashed one leaves the cache)
            self.pool.take(source)
            own.append(source.block_id)
        ids = [b.block_id for b in prefix.blocks] + self._reload(prefix)
        own += [self.pool.allocate().block_id for _ in range(need - len(prefix.host) - len(own))]
        if source is not None and source.block_id != own[0]:
            # copy-on-write: the shared tokens' KV into the request's own block (it writes the rest); the
            # source is held by a running request, so nothing this step overwrites it before the copy
            self._plan.local.append((source.block_id, own[0]))
        self._tables[req.key] = BlockTable(ids + own, list(prefix.hashes), list(prefix.disk_digests))
        return True

    def _reload(self, prefix: CachedPrefix) -> list[int]:
        """Device blocks for the prefix's host hits, registered at once (the copies run before any
        forward pass of this step reads them)."""
        ids: list[int] = []
        for host in prefix.host:
            assert self.host is not None and host.key is not None
            block = self.pool.allocate()
            self.pool.register(block, host.key[0], host.key[1])
            self.pool.partial.set(block.block_id, host.key[0], host.key[1])
            self.host.reload(host, block.block_id, self._plan)
            ids.append(block.block_id)
        return ids

    def can_append(self, req: Request, num_new_tokens: int) -> bool:
        need = self._blocks_for(req.num_computed_tokens + num_new_tokens) - len(self.block_table(req))
        return need <= self.pool.num_free

    def append(self, req: Request, num_new_tokens: int) -> None:
        table = self._tables[req.key]
        need = self._blocks_for(req.num_computed_tokens + num_new_tokens) - len(table.block_ids)
        table.block_ids.extend(self.pool.allocate().block_id for _ in range(max(need, 0)))

    def commit_computed(self, req: Request) -> None:
        """Hash the blocks that became full with computed tokens, so later requests can hit them."""
        table = self._tables[req.key]
        bs = self.block_size
        for i in range(len(table.block_hashes), req.num_computed_tokens // bs):
            parent = table.block_hashes[i - 1] if i else None
            block = self.pool.blocks[table.block_ids[i]]
            tokens = req.token_ids[i * bs : (i + 1) * bs]
            table.block_hashes.append(self.pool.register(block, parent, tokens))
            if self.pool.enable_caching:
                self.pool.partial.set(block.block_id, parent, tokens)
            disk = self.host.disk if self.host is not None else None
            if disk is not None and (i + 1) * bs <= req.num_prompt_tokens:
                disk.persist(
                    disk.digests(table.disk_digests, req.token_ids, i + 1, bs), i, block.block_id, self._plan
                )
        i, extra = divmod(req.num_computed_tokens, bs)
        if extra and self.pool.enable_caching and i < len(table.block_ids):
            # the partial last block: findable for token-granular sharing, also after this request ends
            parent = table.block_hashes[i - 1] if i else None
            self.pool.partial.set(table.block_ids[i], parent, req.token_ids[i * bs : i * bs + extra])

    def truncate(self, req: Request) -> None:
        """Give back the blocks past ``req.num_computed_tokens`` (rejected speculative positions)."""
        table = self._tables[req.key]
        keep = max(self._blocks_for(req.num_computed_tokens), len(table.block_hashes))
        while len(table.block_ids) > keep:
            self.pool.release(self.pool.blocks[table.block_ids.pop()])

    def free(self, req: Request) -> None:
        """Tail blocks first, so the LRU queue evicts a request's suffix before its shared prefix."""
        table = self._tables.pop(req.key, None)
        if table is None:
            return
        for block_id in reversed(table.block_ids):
            self.pool.release(self.pool.blocks[block_id])
