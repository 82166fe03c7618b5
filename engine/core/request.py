"""A request is its token list plus how many of those tokens have KV in the cache."""

from __future__ import annotations

import enum
import itertools
import time
from dataclasses import dataclass, field
from typing import Any

from prefixflow.engine.core.block_pool import chain_hash
from prefixflow.engine.outputs import FinishReason, TokenLogprob
from prefixflow.engine.sampling.sampling_params import SamplingParams

_KEYS = itertools.count()  # process-wide, so keys never collide between engines or tests


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass(eq=False)
class Request:
    """Mutable per-request state; after ``add`` only the scheduler writes it.

    The one invariant: ``num_computed_tokens`` catches up to ``len(token_ids)``. Decode, chunked
    prefill, prefix-cache hits and resume after preemption are all that rule.

    ``key`` is unique in the process (callers' ``index``/``request_id`` need not be). A request with
    ``max_tokens == 0`` generates nothing: it finishes once its prompt is computed. ``score_from``
    asks for the log-probabilities of the prompt tokens from that position on, summed into
    ``prompt_logprob_sum`` (label scoring is such a prefill-only request).

    State that must survive preemption (everything except the KV it held) lives here: per-request
    sampling state sits beside ``token_ids`` (the structured-output matcher is ``grammar``), and
    ``reset_computed`` is where anything derived from computed KV is forgotten.
    """

    index: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int
    score_from: int | None = None
    token_ids: list[int] = field(init=False)
    # Structured outputs: the grammar matcher, which has consumed exactly the output tokens. Preemption
    # keeps the tokens, so it keeps the matcher too (nothing to roll back).
    grammar: Any = field(default=None, repr=False)
    num_computed_tokens: int = 0
    # Speculative decoding: the last ``num_draft_tokens`` of ``token_ids`` are proposed, not yet
    # verified (the step that computes them verifies them); ``spec`` is the proposer's per-request state.
    num_draft_tokens: int = 0
    spec: Any = field(default=None, repr=False)
    num_cached_tokens: int = 0
    status: Status = Status.WAITING
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_logprob_sum: float = 0.0
    # SamplingParams.prompt_logprobs: prompt position -> its record (a recompute after preemption
    # overwrites the same positions)
    prompt_logprobs: dict[int, TokenLogprob] = field(default_factory=dict)
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    num_preemptions: int = 0
    lane: int = 0  # the scheduler lane (virtual engine) running it; set at each admission
    num_computed_before_preemption: int = 0  # positions below this that are computed again are recompute
    finish_reason: FinishReason | None = None
    stop_reason: str | int | None = None
    # Stop strings (see StopChecker): characters of output text already searched, and where the stop
    # string that ended the request starts.
    stop_scan_from: int | None = None
    stop_at: int | None = None
    error: str | None = None
    key: int = field(default_factory=lambda: next(_KEYS), kw_only=True)
    _prompt_hashes: tuple[int, list[int]] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.token_ids = list(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[len(self.prompt_token_ids) :]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - len(self.prompt_token_ids)

    @property
    def generates(self) -> bool:
        return self.max_tokens > 0

    @property
    def max_total_tokens(self) -> int:
        """Tokens this request can ever hold in the cache (it never computes its last sample)."""
        if not self.generates:
            return self.num_prompt_tokens
        return self.num_prompt_tokens + self.max_tokens - 1

    @property
    def first_scored(self) -> int | None:
        """The first prompt token whose log-prob this request needs (scoring: ``score_from``;
        ``prompt_logprobs``: the second token), or None."""
        if self.score_from is not None:
            return self.score_from
        return 1 if self.params.prompt_logprobs is not None else None

    @property
    def max_cache_hit_tokens(self) -> int:
        """A prefix-cache hit may cover at most this many tokens: every position whose logits the
        request needs (its last token, and the scored prompt positions) must be computed."""
        limit = self.num_tokens - 1
        if self.first_scored is not None:
            limit = min(limit, self.first_scored - 1)
        return limit

    def prompt_block_hashes(self, block_size: int) -> list[int]:
        """Chained hashes of the prompt's full blocks; a pure function of the prompt, memoized."""
        if self._prompt_hashes is None or self._prompt_hashes[0] != block_size:
            parent: int | None = None
            hashes: list[int] = []
            for i in range(self.num_prompt_tokens // block_size):
                parent = chain_hash(parent, self.prompt_token_ids[i * block_size : (i + 1) * block_size])
                hashes.append(parent)
            self._prompt_hashes = (block_size, hashes)
        return self._prompt_hashes[1]

    def drop_drafts(self, keep: int = 0) -> None:
        """Forget all but the first ``keep`` proposed tokens (they were never verified)."""
        extra = self.num_draft_tokens - keep
        if extra > 0:
            del self.token_ids[len(self.token_ids) - extra :]
            self.num_draft_tokens = keep

    def reset_computed(self) -> None:
        """Preempted: its KV is gone, so everything derived from computed positions restarts."""
        self.num_computed_before_preemption = max(
            self.num_computed_before_preemption, self.num_computed_tokens
        )
        self.num_computed_tokens = 0
        self.drop_drafts()
        self.prompt_logprob_sum = 0.0  # a scoring request recomputes, and re-adds, every log-prob


@dataclass(frozen=True)
class RequestSpec:
    """A request as a caller describes it, before the engine admits it.

    ``index`` and ``request_id`` label the output; ``score_from`` makes it a scoring request: it
    generates nothing and reports the summed log-probabilities of its tokens from that position on.
    """

    index: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    score_from: int | None = None
