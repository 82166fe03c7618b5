"""Per-request block tables on top of the block pool, including prefix-cache hits.

Capacity checks happen here so the scheduler never asks the pool for a block it does not have.
"""

from __future__ import annotations

from prefixflow.engine.block_pool import Block, BlockPool, chain_hash
from prefixflow.engine.request import Request


class KVCacheManager:
    def __init__(
        self, num_blocks: int, block_size: int, enable_caching: bool = True, reserve_output_blocks: int = 4
    ) -> None:
        self.block_size = block_size
        self.reserve_output_blocks = reserve_output_blocks
        self.pool = BlockPool(num_blocks, enable_caching)

    @property
    def num_blocks(self) -> int:
        return len(self.pool.blocks)

    def _blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def cached_prefix(self, req: Request) -> tuple[list[Block], list[int]]:
        """Longest run of cached full blocks; never covers the last token (it must produce logits)."""
        if not self.pool.enable_caching:
            return [], []
        bs = self.block_size
        limit = (req.num_tokens - 1) // bs
        if req.score_start is not None:
            limit = min(limit, (req.score_start - 1) // bs)
        hits: list[Block] = []
        hashes: list[int] = []
        parent = None
        for i in range(limit):
            tokens = req.token_ids[i * bs : (i + 1) * bs]
            block = self.pool.lookup(parent, tokens)
            if block is None:
                break
            hits.append(block)
            parent = block.block_hash
            hashes.append(parent)
        return hits, hashes

    def prompt_block_hashes(self, req: Request) -> list[int]:
        """Chained hashes of the prompt's full blocks, computed once per request."""
        if req.prompt_hashes is None:
            bs, parent, hashes = self.block_size, None, []
            for i in range(req.num_prompt_tokens // bs):
                parent = chain_hash(parent, req.prompt_token_ids[i * bs : (i + 1) * bs])
                hashes.append(parent)
            req.prompt_hashes = hashes
        return req.prompt_hashes

    def blocks_reserved(self, req: Request) -> int:
        """Blocks a running request is still promised (see ``reservation_tokens``) but does not hold."""
        return max(0, self._blocks_for(self.reservation_tokens(req)) - len(req.block_table))

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
        hits: list[Block],
        hashes: list[int],
        num_new_tokens: int,
        reserved: int | None = None,
    ) -> bool:
        """Give a waiting request its cached prefix plus room for ``num_new_tokens``; False if it won't fit.

        With ``reserved`` (blocks already promised to running prefills), the request must also fit
        its whole prompt plus a decode token: admitting a prompt the pool cannot finish only leads
        to preempting it, or someone else, and computing it again.
        """
        idle_hits = sum(1 for b in hits if b.ref_count == 0)
        cached = len(hits) * self.block_size
        need = self._blocks_for(cached + num_new_tokens) - len(hits)
        if reserved is not None:
            whole = self._blocks_for(self.reservation_tokens(req)) - len(hits)
            if whole + idle_hits + reserved > self.pool.num_free:
                return False
        if need + idle_hits > self.pool.num_free:
            return False
        for block in hits:
            self.pool.acquire(block)
        req.block_table = [b.block_id for b in hits] + [self.pool.allocate().block_id for _ in range(need)]
        req.num_computed_tokens = cached
        if req.num_preemptions == 0:
            req.num_cached_tokens = cached  # report the first admission's hit, not recompute hits
        req.block_hashes = list(hashes)
        req.num_hashed_blocks = len(hits)
        return True

    def can_append(self, req: Request, num_new_tokens: int) -> bool:
        need = self._blocks_for(req.num_computed_tokens + num_new_tokens) - len(req.block_table)
        return need <= self.pool.num_free

    def append(self, req: Request, num_new_tokens: int) -> None:
        need = self._blocks_for(req.num_computed_tokens + num_new_tokens) - len(req.block_table)
        req.block_table.extend(self.pool.allocate().block_id for _ in range(max(need, 0)))

    def commit_computed(self, req: Request) -> None:
        """Hash the blocks that became full with computed tokens, so later requests can hit them."""
        bs = self.block_size
        for i in range(req.num_hashed_blocks, req.num_computed_tokens // bs):
            parent = req.block_hashes[i - 1] if i else None
            block = self.pool.blocks[req.block_table[i]]
            req.block_hashes.append(self.pool.register(block, parent, req.token_ids[i * bs : (i + 1) * bs]))
        req.num_hashed_blocks = max(req.num_hashed_blocks, req.num_computed_tokens // bs)

    def free(self, req: Request) -> None:
        """Tail blocks first, so the LRU queue evicts a request's suffix before its shared prefix."""
        for block_id in reversed(req.block_table):
            self.pool.release(self.pool.blocks[block_id])
        req.block_table = []
        req.block_hashes = []
        req.num_hashed_blocks = 0
