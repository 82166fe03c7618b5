"""The host tier as the KV cache manager sees it: where an evicted device block goes, how far a
waiting request's prefix continues in host memory, and what that reload costs against recompute.

One LRU order spans both tiers: the device pool evicts its least recently used free block, which
enters the host tier as its most recently used block; the host tier drops its own least recently
used block to make room. A block the host already holds is not copied again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefixflow.engine.core.block_pool import Block, chain_hash
from prefixflow.engine.kv_offload.copy_plan import CopyPlan
from prefixflow.engine.kv_offload.cost_model import CostModel
from prefixflow.engine.kv_offload.disk_tier import DiskTier
from prefixflow.engine.kv_offload.host_pool import HostBlock, HostBlockPool


@dataclass
class TierCounters:
    offloaded_blocks: int = 0
    reloaded_blocks: int = 0
    host_lookups: int = 0  # host probes after a device miss (hits and the miss that ends each run)
    host_hits: int = 0
    declined_blocks: int = 0  # host hits the cost model chose to recompute instead


class HostTier:
    def __init__(self, num_blocks: int, cost: CostModel | None) -> None:
        self.pool = HostBlockPool(num_blocks)
        self.cost = cost
        self.counters = TierCounters()
        self.disk: DiskTier | None = None  # below this tier: kv_cache_dir (disk_tier.py)
        self._pinned: list[HostBlock] = []
        self._written: set[int] = set()  # host blocks an offload of this step's plan writes

    def offload(self, block: Block, plan: CopyPlan) -> None:
        """The device pool is about to reuse ``block``: keep its contents in host memory."""
        if block.block_hash is None or block.key is None:
            return
        host = self.pool.store(block.block_hash, block.key)
        if host is None:
            return
        self._claim(host, plan)
        self._written.add(host.host_id)
        plan.offload.append((block.block_id, host.host_id))
        self.counters.offloaded_blocks += 1

    def _claim(self, host: HostBlock, plan: CopyPlan) -> None:
        """``host`` was just handed out again: an offload into it planned earlier this step is dead."""
        if host.host_id in self._written:
            plan.offload[:] = [pair for pair in plan.offload if pair[1] != host.host_id]
            self.counters.offloaded_blocks -= 1
            self._written.discard(host.host_id)

    def continue_prefix(
        self,
        token_ids: Sequence[int],
        parent: int | None,
        first: int,
        last: int,
        block_size: int,
        plan: CopyPlan | None = None,
        digests: list[bytes] | None = None,
    ) -> list[HostBlock]:
        """Host blocks ``first .. last - 1`` of the chain after ``parent`` while they are held, or
        none when the cost model says recomputing them is cheaper; then, with a disk tier, the blocks
        that continue the run on disk, read into host blocks (``digests``: the request's disk chain
        so far, extended here; ``plan``: this step's copies, which a host block taken for a disk
        read must drop an offload from)."""
        found: list[HostBlock] = []
        for i in range(first, last):
            self.counters.host_lookups += 1
            block = self.pool.lookup(parent, token_ids[i * block_size : (i + 1) * block_size])
            if block is None:
                break
            found.append(block)
            parent = block.block_hash
        if (
            found
            and self.cost is not None
            and not self.cost.reload_cheaper(first * block_size, len(found) * block_size)
        ):
            self.counters.declined_blocks += len(found)
            return []
        self.counters.host_hits += len(found)
        if self.disk is not None and first + len(found) < last:
            if found:
                parent = found[-1].block_hash
            found += self._from_disk(
                token_ids,
                parent,
                first + len(found),
                last,
                block_size,
                found,
                plan if plan is not None else CopyPlan(),
                digests if digests is not None else [],
            )
        return found

    def _from_disk(
        self,
        token_ids: Sequence[int],
        parent: int | None,
        first: int,
        last: int,
        bs: int,
        held: list[HostBlock],
        plan: CopyPlan,
        digests: list[bytes],
    ) -> list[HostBlock]:
        """Read the run of blocks from ``first`` that is on disk into host blocks (registered under
        the device cache's hashes), when the cost model says that beats recompute."""
        disk = self.disk
        assert disk is not None
        disk.digests(digests, token_ids, last, bs)
        n = min(disk.run_on_disk(digests, first, last), len(self.pool.lru) - len(held))
        disk.counters.lookups += 1
        if n <= 0:
            return []
        disk.counters.found_blocks += n
        if not disk.worth_reading(first * bs, n, bs):
            return []
        for block in held:  # storing below must not evict this prefix's host hits
            self.pool.pin(block)
        targets: list[HostBlock] = []
        for i in range(first, first + n):
            tokens = tuple(token_ids[i * bs : (i + 1) * bs])
            h = chain_hash(parent, tokens)
            host = self.pool.store(h, (parent, tokens))
            if host is None:
                break  # already held further on, or every host block pinned: the run ends here
            self._claim(host, plan)
            self.pool.pin(host)
            targets.append(host)
            parent = h
        loaded = disk.load([(digests[first + j], host.host_id) for j, host in enumerate(targets)])
        for host in targets[loaded:]:
            self.pool.forget(host)
        for host in held + targets[:loaded]:
            self.pool.unpin(host)
        return targets[:loaded]

    def reload(self, host: HostBlock, device_block: int, plan: CopyPlan) -> None:
        """Copy ``host`` (pinned by ``pin``) into ``device_block``; it stays pinned until the plan is taken."""
        self._pinned.append(host)
        plan.reload.append((host.host_id, device_block))
        self.counters.reloaded_blocks += 1

    def pin(self, hosts: Sequence[HostBlock]) -> None:
        """Protect a request's host hits while its device blocks are allocated (which may offload)."""
        for host in hosts:
            self.pool.pin(host)

    def copies_planned(self) -> None:
        """The step's plan was handed to the runner; copies run in plan order on one stream, so a
        later offload into these host blocks cannot overtake the reloads that read them."""
        for host in self._pinned:
            self.pool.unpin(host)
        self._pinned.clear()
        self._written.clear()
