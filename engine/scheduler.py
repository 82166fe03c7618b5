"""Iteration-level continuous batching under a per-step token budget, with preemption by recompute.

Each step first serves running requests (a decode token, or the next chunk of a prefill), oldest
first; when blocks run out the newest running request gives its blocks back and returns to the
front of the queue. Only then are waiting requests admitted, in queue order, with their cached
prefix mapped in. A request that could never fit is rejected before it reaches this queue.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from prefixflow.engine.kv_cache_manager import KVCacheManager
from prefixflow.engine.request import Request, Status


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int


class Scheduler:
    def __init__(self, limits: SchedulerLimits, kv: KVCacheManager) -> None:
        self.limits = limits
        self.kv = kv
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> list[tuple[Request, int]]:
        budget = self.limits.max_num_batched_tokens
        out: list[tuple[Request, int]] = []
        preempted = False
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            while not self.kv.can_append(req, n):
                victim = self.running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                self.kv.append(req, n)
                out.append((req, n))
                budget -= n
                i += 1
                continue
            break
        if not preempted:
            budget = self._admit(out, budget)
        return out

    def _admit(self, out: list[tuple[Request, int]], budget: int) -> int:
        """Admit waiting requests in queue order, but hold back one whose next uncached block is
        being computed right now by another request: it will hit the cache a step later instead of
        computing the same prefix twice (the queue is prefix-sorted, so such requests are adjacent).
        Requests behind a held one are admitted only while the pool can also take what the held
        ones will need without evicting cached blocks; otherwise a later prefix group would push
        out the prefix the held group is waiting for."""
        in_flight = self._blocks_in_flight()
        if not self.waiting:
            return budget
        reserved = sum(self.kv.blocks_reserved(r) for r in self.running)
        held: list[Request] = []
        held_need = 0  # blocks the held requests will allocate beyond the prefix they wait for
        scanned = 0
        while self.waiting and budget > 0 and len(self.running) < self.limits.max_num_seqs:
            if scanned >= self.limits.max_num_seqs * 2:
                break
            scanned += 1
            req = self.waiting.popleft()
            hits, hashes = self.kv.cached_prefix(req)
            pending = self.kv.prompt_block_hashes(req)[len(hits) :]
            own_blocks = self.kv.blocks_for_reservation(req) - len(hits)
            if in_flight and pending and pending[0] in in_flight:
                held.append(req)
                held_need += own_blocks - sum(1 for h in pending if h in in_flight)
                continue
            if held and self.kv.pool.num_free_uncached - reserved - held_need < own_blocks:
                held.append(req)  # it would evict what the held requests are about to reuse
                break
            n = min(req.num_tokens - len(hits) * self.kv.block_size, budget)
            if not self.kv.admit(req, hits, hashes, n, reserved if self.running else None):
                held.append(req)
                break
            req.status = Status.RUNNING
            self.running.append(req)
            reserved += self.kv.blocks_reserved(req)
            out.append((req, n))
            budget -= n
            if self.kv.pool.enable_caching:
                in_flight.update(pending)
        self.waiting.extendleft(reversed(held))
        return budget

    def _blocks_in_flight(self) -> set[int]:
        """Hashes of full prompt blocks that running requests have not finished computing."""
        if not self.kv.pool.enable_caching:
            return set()
        bs = self.kv.block_size
        pending: set[int] = set()
        for req in self.running:
            if req.num_computed_tokens < req.num_prompt_tokens:
                pending.update(self.kv.prompt_block_hashes(req)[req.num_computed_tokens // bs :])
        return pending

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.num_computed_tokens = 0
        req.score = 0.0  # a scoring request recomputes, and re-adds, every log-prob
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def finish(self, req: Request) -> None:
        self.running.remove(req)
        self.kv.free(req)
        req.status = Status.FINISHED
