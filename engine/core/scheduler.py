"""Iteration-level continuous batching under a per-step token budget, with preemption by recompute.

Each step first serves running requests (a decode token, or the next chunk of a prefill), oldest
first; when blocks run out the newest running request gives its blocks back and returns to the
front of the queue. Only then are waiting requests admitted, in queue order, with their cached
prefix mapped in. A request that could never fit is rejected before it reaches this queue.

The scheduler is the only writer of request state once a request is added: ``schedule`` decides a
step, ``update_from_output`` applies what the model produced (computed tokens, sampled tokens,
log-probs, stops) and returns the requests that finished.

Lanes (pipeline parallelism's virtual engines, docs/engine.md "Pipeline parallelism"): with
``lanes=V`` the running requests are split into V disjoint groups over the one block pool and the one
waiting queue. ``schedule(lane)`` serves that lane's running requests and admits waiting ones into it
(up to ``ceil(max_num_seqs / V)`` each, so all lanes together run at most about ``max_num_seqs``);
it preempts only its own lane, because the other lanes' requests are in a step still in flight. A
request keeps its lane until it is preempted or finishes; the queue order (prefix-sorted) is the
admission order whichever lane admits. With one lane this is the plain scheduler.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from prefixflow.engine.core.kv_cache_manager import KVCacheManager
from prefixflow.engine.core.request import Request, Status
from prefixflow.engine.core.step_types import ModelOutput, ScheduledChunk, SchedulerOutput
from prefixflow.engine.outputs import FinishReason, TokenLogprob
from prefixflow.engine.sampling.stop_checker import StopChecker
from prefixflow.engine.speculative.runs import SpeculationStats, fit_drafts, settle


@dataclass(frozen=True)
class SchedulerLimits:
    max_num_seqs: int
    max_num_batched_tokens: int


class Scheduler:
    def __init__(
        self, limits: SchedulerLimits, kv: KVCacheManager, stop_checker: StopChecker, lanes: int = 1
    ) -> None:
        self.limits = limits
        self.kv = kv
        self.stop_checker = stop_checker
        self.waiting: deque[Request] = deque()
        self.lanes: list[list[Request]] = [[] for _ in range(lanes)]
        self.lane_max_seqs = -(-limits.max_num_seqs // lanes)
        self.num_preemptions = 0
        self.speculation = SpeculationStats()  # what verified runs proposed and accepted

    def add(self, req: Request) -> None:
        self.waiting.append(req)

    @property
    def running(self) -> list[Request]:
        """Every lane's running requests (a new list: change them through the scheduler only)."""
        if len(self.lanes) == 1:
            return list(self.lanes[0])
        return [r for lane in self.lanes for r in lane]

    def has_work(self) -> bool:
        return bool(self.waiting) or any(self.lanes)

    def lane_has_work(self, lane: int) -> bool:
        """Whether ``schedule(lane)`` could schedule anything: its own requests, or waiting ones."""
        return bool(self.lanes[lane]) or bool(self.waiting)

    def num_unfinished(self) -> int:
        return len(self.waiting) + sum(len(lane) for lane in self.lanes)

    # -- deciding a step --------------------------------------------------------------------------
    def schedule(self, lane: int = 0) -> SchedulerOutput:
        running = self.lanes[lane]
        budget = self.limits.max_num_batched_tokens
        out: list[ScheduledChunk] = []
        preempted = False
        i = 0
        while i < len(running) and budget > 0:
            req = running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            if req.num_draft_tokens:
                n = fit_drafts(req, n, self.kv)  # drafts only while they fit the budget and the free blocks
            while not self.kv.can_append(req, n):
                victim = running[-1]
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
            else:
                self.kv.append(req, n)
                out.append(ScheduledChunk(req, n, self.kv.block_table(req)))
                budget -= n
                i += 1
                continue
            break
        for req in running[i:]:
            req.drop_drafts()  # not scheduled this step: drafts live for one step only
        if not preempted:
            budget = self._admit(out, budget, lane)
        return SchedulerOutput(out)

    def attach_drafts(self, scheduled: SchedulerOutput, drafts: dict[int, list[int]]) -> SchedulerOutput:
        """The step with ``drafts`` (by request key) appended to chunks that end their request's tokens
        (the speculator's ``prefill_drafts``), each cut to what the step's token budget and the free
        blocks still take: drafting never preempts anyone. The chunk then ends in a verified run."""
        budget = self.limits.max_num_batched_tokens - sum(c.num_tokens for c in scheduled)
        chunks: list[ScheduledChunk] = []
        for chunk in scheduled:
            req = chunk.request
            draft = drafts.get(req.key, [])[: max(budget, 0)]
            while draft and not self.kv.can_append(req, chunk.num_tokens + len(draft)):
                draft = draft[:-1]
            if draft and req.num_draft_tokens == 0:
                req.token_ids.extend(draft)
                req.num_draft_tokens = len(draft)
                self.kv.append(req, chunk.num_tokens + len(draft))
                budget -= len(draft)
                chunk = ScheduledChunk(req, chunk.num_tokens + len(draft), self.kv.block_table(req))
            chunks.append(chunk)
        return SchedulerOutput(chunks)

    def _admit(self, out: list[ScheduledChunk], budget: int, lane: int) -> int:
        """Admit waiting requests in queue order, but hold back one whose next uncached block is
        being computed right now by another request: it will hit the cache a step later instead of
        computing the same prefix twice (the queue is prefix-sorted, so such requests are adjacent).
        Requests behind a held one are admitted only while the pool can also take what the held
        ones will need without evicting cached blocks; otherwise a later prefix group would push
        out the prefix the held group is waiting for. Both look at every lane's requests: they share
        the block pool, and another lane's step may be computing that prefix right now."""
        in_flight = self._blocks_in_flight()
        if not self.waiting:
            return budget
        running, everyone = self.lanes[lane], self.running
        bs = self.kv.block_size
        reserved = sum(self.kv.blocks_reserved(r) for r in everyone)
        held: list[Request] = []
        held_need = 0  # blocks the held requests will allocate beyond the prefix they wait for
        scanned = 0
        while self.waiting and budget > 0 and len(running) < self.lane_max_seqs:
            if scanned >= self.limits.max_num_seqs * 2:
                break
            scanned += 1
            req = self.waiting.popleft()
            prefix = self.kv.cached_prefix(req)
            pending = req.prompt_block_hashes(bs)[len(prefix) :]
            own_blocks = self.kv.blocks_for_reservation(req) - prefix.num_device
            if in_flight and pending and pending[0] in in_flight:
                held.append(req)
                held_need += own_blocks - sum(1 for h in pending if h in in_flight)
                continue
            if held and self.kv.num_free_uncached_blocks - reserved - held_need < own_blocks:
                held.append(req)  # it would evict what the held requests are about to reuse
                break
            cached = prefix.tokens(bs)
            n = min(req.num_tokens - cached, budget)
            if not self.kv.admit(req, prefix, n, reserved if everyone else None):
                held.append(req)
                break
            req.num_computed_tokens = cached
            if req.num_preemptions == 0:
                req.num_cached_tokens = cached  # report the first admission's hit, not recompute hits
            req.status = Status.RUNNING
            req.lane = lane
            running.append(req)
            everyone.append(req)
            reserved += self.kv.blocks_reserved(req)
            out.append(ScheduledChunk(req, n, self.kv.block_table(req)))
            budget -= n
            if self.kv.caching_enabled:
                in_flight.update(pending)
        self.waiting.extendleft(reversed(held))
        return budget

    def _blocks_in_flight(self) -> set[int]:
        """Hashes of full prompt blocks that running requests have not finished computing."""
        if not self.kv.caching_enabled:
            return set()
        bs = self.kv.block_size
        pending: set[int] = set()
        for req in self.running:
            if req.num_computed_tokens < req.num_prompt_tokens:
                pending.update(req.prompt_block_hashes(bs)[req.num_computed_tokens // bs :])
        return pending

    def _preempt(self, req: Request) -> None:
        self.lanes[req.lane].remove(req)
        self.kv.free(req)
        req.reset_computed()
        req.status = Status.WAITING
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # -- applying a step's results ----------------------------------------------------------------
    def update_from_output(self, scheduled: SchedulerOutput, output: ModelOutput) -> list[Request]:
        """Advance every scheduled request by what the step computed; return those that finished.

        A request named in ``output.errors``, or whose stop check fails, finishes with
        ``finish_reason="error"``; the others are not affected.
        """
        finished: list[Request] = []
        now = time.perf_counter()
        for chunk in scheduled:
            req = chunk.request
            if req.status is not Status.RUNNING:
                continue  # aborted after it was scheduled
            error = output.errors.get(req.key)
            if error is not None:
                finished.append(self.finish(req, "error", error=error))
                continue
            if req.num_draft_tokens:
                done = self._settle_run(req, output, now)
                if done is not None:
                    finished.append(done)
                continue
            req.num_computed_tokens += chunk.num_tokens
            self.kv.commit_computed(req)
            if req.score_from is not None:
                req.prompt_logprob_sum += output.prompt_logprobs.get(req.key, 0.0)
            for position, record in output.prompt_positions.get(req.key, ()):
                req.prompt_logprobs[position] = record
            if not req.generates:
                if req.num_computed_tokens == req.num_tokens:
                    finished.append(self.finish(req, "stop"))
                continue
            token = output.sampled.get(req.key)
            if token is None:
                continue  # a prefill chunk that has not reached the last prompt token
            done = self._take_token(req, token, output.logprobs.get(req.key), now)
            if done is not None:
                finished.append(done)
        return finished

    def _take_token(
        self, req: Request, token: int, logprob: TokenLogprob | None, now: float
    ) -> Request | None:
        """Append one generated token; the request if that finished it."""
        req.token_ids.append(token)
        if req.grammar is not None and not req.grammar.accept_token(token):
            error = f"structured outputs: the grammar rejected sampled token {token}"
            return self.finish(req, "error", error=error)
        if logprob is not None:
            req.logprobs.append(logprob)
        if req.first_token_time is None:
            req.first_token_time = now
        try:
            verdict = self.stop_checker.check(req)
        except Exception as exc:  # e.g. a tokenizer that cannot decode: this request only
            return self.finish(req, "error", error=f"stop check failed: {exc!r}")
        if verdict is None and req.grammar is not None and req.grammar.is_terminated():
            verdict = ("stop", None)  # the grammar ended it on a stop token the model does not list as EOS
        if verdict is not None:
            return self.finish(req, verdict[0], verdict[1])
        return None

    def _settle_run(self, req: Request, output: ModelOutput, now: float) -> Request | None:
        """A verified run: keep the accepted drafts and the target's next token, one token at a time
        (stops, max_tokens and the grammar see each), roll the rest back and hash only what stays."""
        targets = output.verified.get(req.key)
        if targets is None:
            req.drop_drafts()
            return self.finish(req, "error", error="speculative verification produced no tokens")
        emitted = settle(req, targets, self.speculation)
        logprobs = output.verified_logprobs.get(req.key, [])
        first = req.num_tokens  # emitted[j] lands at token index first + j
        for j, token in enumerate(emitted):
            req.num_computed_tokens = first + j  # positions before it hold KV computed from the right tokens
            self.kv.commit_computed(req)
            done = self._take_token(req, token, logprobs[j] if j < len(logprobs) else None, now)
            if done is not None:
                return done
        self.kv.truncate(req)
        return None

    def finish(
        self,
        req: Request,
        reason: FinishReason,
        stop_reason: str | int | None = None,
        error: str | None = None,
    ) -> Request:
        self.lanes[req.lane].remove(req)
        self.kv.free(req)
        req.status = Status.FINISHED
        req.finish_reason, req.stop_reason, req.error = reason, stop_reason, error
        return req

    def abort(self, keys: Iterable[int]) -> int:
        """Drop the given requests wherever they are, returning their blocks; how many were found."""
        wanted = set(keys)
        dropped = [r for r in self.running if r.key in wanted]
        for req in dropped:
            self.lanes[req.lane].remove(req)
            self.kv.free(req)
        if any(r.key in wanted for r in self.waiting):
            dropped += [r for r in self.waiting if r.key in wanted]
            self.waiting = deque(r for r in self.waiting if r.key not in wanted)
        for req in dropped:
            req.status = Status.FINISHED
        return len(dropped)

    def abort_all(self) -> int:
        return self.abort([r.key for r in self.running] + [r.key for r in self.waiting])
