"""A request is its token list plus how many of those tokens have KV in the cache."""

from __future__ import annotations

import enum
import time
from dataclasses import dataclass, field
from typing import Any

from prefixflow.engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


@dataclass
class Request:
    """Mutable per-request state owned by the scheduler.

    The one invariant: ``num_computed_tokens`` catches up to ``len(token_ids)``. Decode, chunked
    prefill, prefix-cache hits and resume after preemption are all that rule.
    """

    index: int
    request_id: str
    prompt_token_ids: list[int]
    params: SamplingParams
    max_tokens: int
    seed: int
    score_start: int | None = None  # scoring request: sum logprobs of tokens from here on
    token_ids: list[int] = field(init=False)
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0
    block_hashes: list[int] = field(default_factory=list)
    prompt_hashes: list[int] | None = None
    status: Status = Status.WAITING
    logprobs: list = field(default_factory=list)
    score: float = 0.0
    arrival_time: float = field(default_factory=time.perf_counter)
    first_token_time: float | None = None
    num_preemptions: int = 0
    grammar: Any = None  # structured outputs: the matcher that has consumed exactly the output tokens

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
    def max_total_tokens(self) -> int:
        """Tokens this request can ever hold in the cache (it never computes its last sample)."""
        if self.score_start is not None:
            return self.num_prompt_tokens
        return self.num_prompt_tokens + self.max_tokens - 1
