"""The engine's speculation step: before scheduling, give decoding requests their drafts.

Drafts are appended to the request's ``token_ids`` (``num_draft_tokens`` says how many), so the
scheduler, the KV cache and the model runner see an ordinary chunk of k+1 tokens; ``runs.settle``
undoes what the target rejects. Rank 0 proposes (this object lives in the driver); every tensor-
parallel rank computes the chunk. After each step the engine reports the step's time, which feeds
the cost model of the ``auto`` policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np

from prefixflow.engine.core.request import Request
from prefixflow.engine.core.step_types import SchedulerOutput
from prefixflow.engine.speculative.config import SpeculativeConfig
from prefixflow.engine.speculative.cost_model import LinearCost
from prefixflow.engine.speculative.forced import ForcedDrafts, Pending
from prefixflow.engine.speculative.ngram import NgramIndex
from prefixflow.engine.speculative.output_pool import OutputPool
from prefixflow.engine.speculative.policy import (
    MARGIN,
    PRIOR_ACCEPTANCE,
    PRIOR_CROSS_REQUEST,
    PRIOR_FORCED,
    Acceptance,
    Calibration,
    Candidate,
    StepTerms,
    plan_drafts,
)
from prefixflow.engine.speculative.runs import CROSS_REQUEST, JUMP_FORWARD, Origin, SpeculationStats
from prefixflow.engine.speculative.tail import REFRESH_STEPS, TIE_PRIOR_STOPS, tail_worths, tie_weight


@dataclass
class RequestSpecState:
    """What one request's speculation remembers: its n-gram index, its acceptance, and where each of
    its pending drafts came from.

    Acceptance counts the drafts a run reached (up to and including the first rejected one), so
    ``accepted / reached`` estimates the per-draft alpha of the policy's alpha^j model. The method's own
    drafts, grammar-forced ones (engine-wide) and cross-request ones (per request and engine-wide) are
    counted apart."""

    index: NgramIndex | None
    acceptance: Acceptance = field(default_factory=Acceptance)
    method: Acceptance | None = None  # the method-wide counter, updated alongside
    jump_forward: Acceptance | None = None  # grammar-forced drafts, engine-wide
    cross: Acceptance = field(default_factory=Acceptance)  # this request's cross-request drafts
    cross_request: Acceptance | None = None  # cross-request drafts, engine-wide
    origins: list[Origin] = field(default_factory=list)  # per pending draft: None (own) or its origin
    splits: list[Pending] = field(default_factory=list)  # forced strings awaiting the target's split
    calibration: dict[Origin, Calibration] | None = None  # engine-wide plans against outcomes, per origin
    planned: list[float] = field(default_factory=list)  # ``auto``: each pending draft's expected gain

    def observe(self, origins: list[Origin], accepted: int) -> None:
        if self.calibration is not None and self.planned:  # the drafts verified, of those planned
            for origin, calibration in self.calibration.items():
                mine = [o == origin for o in origins]
                if any(mine):
                    expected = sum(g for g, m in zip(self.planned, mine) if m)
                    calibration.observe(expected, sum(mine[:accepted]))
        self.planned = []
        reached = origins[: accepted + 1]
        counters = (
            (self.acceptance, None),
            (self.method, None),
            (self.jump_forward, JUMP_FORWARD),
            (self.cross, CROSS_REQUEST),
            (self.cross_request, CROSS_REQUEST),
        )
        for counter, origin in counters:
            mine = [o == origin for o in reached]
            if counter is not None and any(mine):
                counter.observe(sum(mine), sum(mine[:accepted]))


class Proposer(Protocol):
    """Where drafts come from. ``lookahead`` says whether proposals are known before the policy
    decides (a lookup: its length bounds k) or cost work to make (a draft model: k is decided first)."""

    lookahead: bool
    seconds_per_token: float

    def propose(self, requests: list[Request], ks: list[int]) -> list[list[int]]: ...

    def forget(self, live: set[int]) -> None:
        """Drop per-request state of every request not in ``live`` (the running ones)."""
        ...


class NgramProposer:
    lookahead = True
    seconds_per_token = 0.0

    def __init__(self, cfg: SpeculativeConfig) -> None:
        self.cfg = cfg

    def propose(self, requests: list[Request], ks: list[int]) -> list[list[int]]:
        out = []
        for req, k in zip(requests, ks):
            state = req.spec
            assert isinstance(state, RequestSpecState) and state.index is not None
            out.append(state.index.propose(req.token_ids, k))
        return out

    def forget(self, live: set[int]) -> None:
        return None  # the index lives on the request


class Speculator:
    def __init__(
        self,
        cfg: SpeculativeConfig,
        proposer: Proposer,
        max_model_len: int,
        stats: SpeculationStats,
        forced: ForcedDrafts | None = None,
    ) -> None:
        self.cfg = cfg
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.stats = stats
        stats.method = cfg.method
        self.cost = LinearCost(3)  # step seconds ~ tokens, sampled rows, distinct draft lengths (policy.py)
        self.method_acceptance = Acceptance()
        self.jump_forward_acceptance = Acceptance()
        self.cross_request_acceptance = Acceptance()
        # looked-up drafts are priced by per-request rates, which the policy selects on: they get a
        # calibration; forced drafts are priced by one engine-wide rate, nothing selected, none needed
        self.calibration: dict[Origin, Calibration] = {
            origin: Calibration() for origin in (None, CROSS_REQUEST)
        }
        self.pool = (
            OutputPool(
                cfg.prompt_lookup_min,
                cfg.prompt_lookup_max,
                cfg.cross_request_requests,
                cfg.cross_request_min_probability,
            )
            if cfg.uses_cross_request and proposer.lookahead
            else None
        )
        self.forced = forced  # grammar-forced drafts for structured-output requests (lookup methods only)
        self.planned_steps = 0  # steps in which at least one request speculated
        self.tail: dict[int, float] = {}  # request key -> its worth in the tail, as last computed
        self.tail_age = REFRESH_STEPS  # steps since
        self.finished_tokens = 0  # output tokens of finished requests, and how many of them ended by a stop
        self.ended = 0
        self.tie_prior_stops = TIE_PRIOR_STOPS  # benchmarks/spec_bench.py's ``auto-shared-ties`` raises it

    def state(self, req: Request) -> RequestSpecState:
        if req.spec is None:
            index = (
                NgramIndex(self.cfg.prompt_lookup_min, self.cfg.prompt_lookup_max)
                if self.proposer.lookahead
                else None
            )
            req.spec = RequestSpecState(
                index,
                method=self.method_acceptance,
                jump_forward=self.jump_forward_acceptance,
                cross_request=self.cross_request_acceptance,
                calibration=self.calibration,
            )
        assert isinstance(req.spec, RequestSpecState)
        return req.spec

    def propose(self, running: list[Request], token_budget: int, waiting: bool = True) -> None:
        """Append drafts to the decoding requests the policy picks. ``waiting``: whether requests wait
        for a slot; when none does, the running ones are the job's tail (tail.py)."""
        decoding: list[Request] = []
        limits: list[int] = []
        at: list[int] = []  # each decoding request's place among the generating ones
        budgets: list[int] = []  # per generating request: tokens it may still produce
        base_tokens = base_rows = outputs = 0
        for req in running:
            left = req.num_tokens - req.num_computed_tokens
            base_tokens += left
            if not req.generates:
                continue
            out = req.num_output_tokens
            outputs += out
            budgets.append(req.max_tokens - out)
            if left == 1 and out > 0 and req.num_draft_tokens == 0:  # decoding
                base_rows += 1
                limit = self._limit(req)
                if limit > 0:
                    decoding.append(req)
                    limits.append(limit)
                    at.append(len(budgets) - 1)
        if not decoding:
            return
        base_tokens = min(base_tokens, token_budget)
        worths = None
        if not waiting and len(budgets) > 1 and self.cfg.auto and self.cost.ready:
            self.tail_age += 1
            if self.tail_age >= REFRESH_STEPS or any(r.key not in self.tail for r in decoding):
                every = self._tail_worths(budgets, outputs, base_tokens, base_rows)
                self.tail = {r.key: float(every[i]) for r, i in zip(decoding, at)}
                self.tail_age = 0
            worths = [self.tail[r.key] for r in decoding]
        else:
            self.tail_age = REFRESH_STEPS  # the next tail step computes afresh
        for req, draft in zip(decoding, self._drafts(decoding, limits, base_tokens, base_rows, worths)):
            if draft:
                req.token_ids.extend(draft)
                req.num_draft_tokens = len(draft)

    def _tail_worths(self, budgets: list[int], outputs: int, base_tokens: int, base_rows: int) -> np.ndarray:
        """Per generating request, what its accepted drafts are worth when nothing waits (tail.py).
        The hazard of a stop per token is measured over every output so far, finished or running,
        behind one stop per largest budget a priori; a predicted tie for last is counted as nobody's
        as the stops seen make that hazard trustworthy (``tie_weight``)."""
        terms = StepTerms.of(self.cost)
        left = np.maximum(np.array(budgets, dtype=float), 0.0)
        hazard = (self.ended + 1.0) / (self.finished_tokens + outputs + max(float(left.max()), 1.0))
        step_time = terms.time(base_tokens, base_rows)
        return tail_worths(
            left,
            hazard,
            terms.fixed,
            terms.per_draft,
            step_time,
            base_rows,
            tie_weight(self.ended, self.tie_prior_stops),
        )

    def prefill_drafts(self, scheduled: SchedulerOutput) -> dict[int, list[int]]:
        """Drafts for the requests whose last prompt chunk (or recompute after preemption) runs this
        step, by request key: the tokens that chunk's sample should be followed by, so the step that
        samples a request's first token also verifies the next ones (one step fewer per request).

        Lookup methods only: the n-gram index and the grammar need no model, while a draft model would
        first have to prefill the prompt itself. Requests that score prompt positions are left out
        (their chunk's rows are prompt log-probs, which a verified run does not collect). The scheduler
        attaches what fits the step's budget and the free blocks (``Scheduler.attach_drafts``)."""
        if not (self.cfg.prefill_drafts and self.proposer.lookahead):
            return {}
        tokens, rows, _ = self.features(scheduled)
        ending: list[Request] = []
        limits: list[int] = []
        for chunk in scheduled:
            req = chunk.request
            if (
                req.generates
                and (req.num_output_tokens == 0 or chunk.num_tokens > 1)  # not a decode the policy passed
                and req.num_draft_tokens == 0
                and req.num_computed_tokens + chunk.num_tokens == req.num_tokens
                and req.first_scored is None
            ):
                limit = self._limit(req)
                if limit > 0:
                    ending.append(req)
                    limits.append(limit)
        if not ending:
            return {}
        drafts = self._drafts(ending, limits, int(tokens), int(rows))
        return {req.key: draft for req, draft in zip(ending, drafts) if draft}

    def _limit(self, req: Request) -> int:
        """The most drafts ``req`` can take now (its k, max_tokens and the model length)."""
        return min(
            self.cfg.max_k,
            req.max_tokens - req.num_output_tokens - 1,
            self.max_model_len - req.num_tokens - 1,
        )

    def _drafts(
        self,
        requests: list[Request],
        limits: list[int],
        base_tokens: int,
        base_rows: int,
        worths: list[float] | None = None,
    ) -> list[list[int]]:
        """Each request's drafts (maybe none): proposed, then cut to the k the policy picks.
        ``worths``: per request, a factor on what its drafts gain (the tail's, else 1)."""
        for req in requests:
            self.state(req)
        worth = worths or [1.0] * len(requests)
        origins: list[list[Origin]] = [[None] * lim for lim in limits]
        if self.proposer.lookahead:  # the proposal's own length bounds k
            proposals, origins = self._look_ahead(
                requests, limits, self._draft_floor(base_tokens, base_rows), worth
            )
            limits = [len(p) for p in proposals]
            if not any(limits):
                return [[] for _ in requests]
        if self.cfg.auto:
            priors = {
                None: self.method_acceptance.rate(PRIOR_ACCEPTANCE),
                JUMP_FORWARD: self.jump_forward_acceptance.rate(PRIOR_FORCED),
            }
            cross_prior = self.cross_request_acceptance.rate(PRIOR_CROSS_REQUEST)
            candidates = []
            for req, kinds, w in zip(requests, origins, worth):
                if not kinds:
                    candidates.append(Candidate(()))
                    continue
                state = self.state(req)
                alphas = {
                    **priors,
                    None: state.acceptance.cautious_rate(priors[None]),
                    CROSS_REQUEST: state.cross.cautious_rate(cross_prior),
                }
                factors = tuple(
                    (self.calibration[o].factor if o in self.calibration else 1.0) * w for o in kinds
                )
                candidates.append(Candidate(tuple(alphas[o] for o in kinds), factors))
            ks = plan_drafts(candidates, base_tokens, base_rows, self.cost, self.proposer.seconds_per_token)
            for req, candidate, k in zip(requests, candidates, ks):
                self.state(req).planned = candidate.gains(calibrated=False)[:k]
        else:
            ks = limits
        if not any(ks):
            return [[] for _ in requests]
        for req, kinds, k in zip(requests, origins, ks):
            self.state(req).origins = kinds[:k]
        self.planned_steps += 1
        if self.proposer.lookahead:
            return [p[:k] for p, k in zip(proposals, ks)]
        chosen = [(r, k) for r, k in zip(requests, ks) if k]
        made = self.proposer.propose([r for r, _ in chosen], [k for _, k in chosen])
        by_key = {r.key: d for (r, _), d in zip(chosen, made)}
        return [by_key.get(r.key, []) for r in requests]

    def _draft_floor(self, base_tokens: int, base_rows: int) -> float:
        """The acceptance a draft needs before ``auto`` could take it: a plan that adds drafts of
        ``d`` seconds each to a step of ``base_rows`` rows and ``t`` seconds must beat plain decoding
        by ``MARGIN``, so some draft in it gains more than ``(1 + MARGIN) * base_rows * d / t``
        tokens, and a request's j-th draft gains at most its calibrated alpha^j. Lookups whose
        acceptance (cautious and calibrated, as the plan will price it) is at most this are skipped:
        at a large batch they would cost CPU time and then be declined (their indexes catch up at the
        next lookup). 0 with a fixed k."""
        if not self.cfg.auto or not self.cost.ready or base_rows <= 0:
            return 0.0
        terms = StepTerms.of(self.cost)
        t = terms.time(base_tokens, base_rows)
        d = terms.per_draft + self.proposer.seconds_per_token
        return (1.0 + MARGIN) * base_rows * d / t if t > 0 else 0.0

    def _look_ahead(
        self, requests: list[Request], limits: list[int], floor: float, worth: list[float]
    ) -> tuple[list[list[int]], list[list[Origin]]]:
        """Lookup proposals; a structured-output request's start with what its grammar forces. Where a
        plain request's own lookup runs short, the cross-request pool continues it. A plain request
        whose acceptance (own, or from the pool), times its worth, is at most ``floor`` skips that
        lookup."""
        drafts: list[list[int]] = [[] for _ in requests]
        origins: list[list[Origin]] = [[] for _ in requests]
        plain = [i for i, r in enumerate(requests) if self.forced is None or r.grammar is None]
        method_prior = self.method_acceptance.rate(PRIOR_ACCEPTANCE)
        own_factor = self.calibration[None].factor
        own = [
            i
            for i in plain
            if floor <= 0
            or self.state(requests[i]).acceptance.cautious_rate(method_prior) * own_factor * worth[i] > floor
        ]
        made = self.proposer.propose([requests[i] for i in own], [limits[i] for i in own]) if own else []
        for i, draft in zip(own, made):
            drafts[i], origins[i] = draft, [None] * len(draft)
        if self.pool is not None:
            # a structured request's drafts must pass its grammar: the pool knows no grammar
            prior = self.cross_request_acceptance.rate(PRIOR_CROSS_REQUEST)
            cross_factor = self.calibration[CROSS_REQUEST].factor
            wanted = [
                i
                for i in plain
                if requests[i].grammar is None
                and len(drafts[i]) < limits[i]
                and (
                    floor <= 0
                    or self.state(requests[i]).cross.cautious_rate(prior) * cross_factor * worth[i] > floor
                )
            ]
            if wanted:  # index what the batch produced since the last lookup (``finished`` does the rest)
                self._index_outputs(requests)
            for i in wanted:  # the pool reads only the last max_n tokens: no copy of the whole context
                tail = requests[i].token_ids[-self.pool.max_n :] + drafts[i]
                more = self.pool.propose(tail, limits[i] - len(drafts[i]))
                drafts[i] = drafts[i] + more
                origins[i] = origins[i] + [CROSS_REQUEST] * len(more)
        if self.forced is not None:
            for i, req in enumerate(requests):
                if req.grammar is not None:
                    drafts[i], forced = self.forced.propose(
                        req.grammar, req.token_ids, self.state(req).index, limits[i], self.state(req).splits
                    )
                    origins[i] = [JUMP_FORWARD if f else None for f in forced]
        return drafts, origins

    def finished(self, requests: list[Request]) -> None:
        """Requests that finished this step: their last tokens join the cross-request pool, and their
        ends the tail's hazard (stops per generated token)."""
        self._index_outputs(requests)
        for req in requests:
            self.finished_tokens += req.num_output_tokens
            self.ended += req.finish_reason == "stop"

    def _index_outputs(self, requests: list[Request]) -> None:
        if self.pool is not None:
            for req in requests:
                self.pool.extend(req.key, req.token_ids, req.num_prompt_tokens, req.num_tokens)

    @staticmethod
    def features(scheduled: SchedulerOutput) -> list[float]:
        """What a step computes, for the cost model (read before the step settles its runs)."""
        tokens = rows = 0
        lengths: set[int] = set()
        for chunk in scheduled:
            tokens += chunk.num_tokens
            req = chunk.request
            if req.generates and req.num_computed_tokens + chunk.num_tokens >= req.num_tokens:
                rows += 1 + req.num_draft_tokens
                if req.num_draft_tokens:
                    lengths.add(req.num_draft_tokens)
        return [float(tokens), float(rows), float(len(lengths))]

    def observe(self, features: list[float], seconds: float, running: list[Request]) -> None:
        """After a step: its cost, for the policy; the proposer drops what finished or was preempted."""
        self.cost.observe(features, seconds)
        if not self.proposer.lookahead:
            self.proposer.forget({r.key for r in running})
