"""The host tier as the KV cache manager sees it: where an evicted device block goes, how far a
waiting request's prefix continues in host memory, and what that reload costs against recompute.

One LRU order spans both tiers: the device pool evicts its least recently used free block, which
enters the host tier as its most recently used block; the host tier drops its own least recently
used block to make room. A block the host already holds is not copied again.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prefixflow.engine.core.block_pool import Block
from prefixflow.engine.kv_offload.copy_plan import CopyPlan
from prefixflow.engine.kv_offload.cost_model import CostModel
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
        self._pinned: list[HostBlock] = []
        self._written: set[int] = set()  # host blocks an offload of this step's plan writes

    def offload(self, block: Block, plan: CopyPlan) -> None:
        """The device pool is about to reuse ``block``: keep its contents in host memory."""
        if block.block_hash is None or block.key is None:
            return
        host = self.pool.store(block.block_hash, block.key)
        if host is None:
            return
        if host.host_id in self._written:  # an earlier offload of this step went there: it is dead
            plan.offload[:] = [pair for pair in plan.offload if pair[1] != host.host_id]
            self.counters.offloaded_blocks -= 1
        self._written.add(host.host_id)
        plan.offload.append((block.block_id, host.host_id))
        self.counters.offloaded_blocks += 1

    def continue_prefix(
        self, token_ids: Sequence[int], parent: int | None, first: int, last: int, block_size: int
    ) -> list[HostBlock]:
        """Host blocks ``first .. last - 1`` of the chain after ``parent`` while they are held, or
        none when the cost model says recomputing them is cheaper."""
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
        return found

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
