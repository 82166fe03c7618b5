"""The records one engine step passes along: scheduler -> model runner -> scheduler."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Protocol

import torch

from prefixflow.engine.core.request import Request
from prefixflow.engine.outputs import TokenLogprob


@dataclass(frozen=True)
class ScheduledChunk:
    """``num_tokens`` more of ``request``'s tokens to compute this step, into ``block_table``."""

    request: Request
    num_tokens: int
    block_table: list[int]


@dataclass(frozen=True)
class SchedulerOutput:
    """What one step computes: a chunk per request, running requests first."""

    chunks: list[ScheduledChunk] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.chunks)

    def __iter__(self) -> Iterator[ScheduledChunk]:
        return iter(self.chunks)

    def only(self, chunk: ScheduledChunk) -> SchedulerOutput:
        """The same step restricted to one request (to find which request a failure belongs to)."""
        return SchedulerOutput([chunk])


@dataclass
class ModelOutput:
    """What the model runner produced for a step, keyed by ``Request.key``.

    ``sampled`` holds a token for each request whose chunk reached its last token; ``prompt_logprobs``
    the sum of the scored prompt positions computed this step; ``errors`` the requests that failed
    inside the step (the scheduler finishes each with its message; the others go on).
    """

    sampled: dict[int, int] = field(default_factory=dict)
    logprobs: dict[int, TokenLogprob] = field(default_factory=dict)
    prompt_logprobs: dict[int, float] = field(default_factory=dict)
    prompt_positions: dict[int, list[tuple[int, TokenLogprob]]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    # Speculative decoding: for a request whose chunk verified draft tokens, the target's token at each
    # of its k+1 positions (each sampled as if the drafts before it were accepted), and their log-probs.
    verified: dict[int, list[int]] = field(default_factory=dict)
    verified_logprobs: dict[int, list[TokenLogprob]] = field(default_factory=dict)

    def merge(self, other: ModelOutput) -> None:
        self.sampled.update(other.sampled)
        self.verified.update(other.verified)
        self.verified_logprobs.update(other.verified_logprobs)
        self.logprobs.update(other.logprobs)
        self.prompt_logprobs.update(other.prompt_logprobs)
        self.prompt_positions.update(other.prompt_positions)
        self.errors.update(other.errors)


class TokenMasks(Protocol):
    """Where the model runner gets the structured-output bitmask of the rows it samples (one row per
    request, 1 bits allowed; None when no row is constrained). ``StructuredOutputManager`` is one."""

    def take_bitmask(self, requests: list[Request]) -> torch.Tensor | None: ...
