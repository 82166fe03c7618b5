"""What the engine hands back for each request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class TokenLogprob:
    """Log-probability of one generated token plus the top alternatives at that position."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class RequestOutput:
    """The result of one finished request.

    ``index`` is the request's position in the ``generate`` call; ``request_id`` is the caller's id
    (or ``str(index)``). On ``finish_reason == "error"`` the text is empty and ``error`` says why.
    """

    request_id: str
    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    error: str | None = None
    prompt_token_ids: tuple[int, ...] = ()
    num_prompt_tokens: int = 0
    num_cached_tokens: int = 0
    num_output_tokens: int = 0
    logprobs: tuple[TokenLogprob, ...] | None = None
    time_to_first_token: float | None = None
    latency: float = 0.0
    stop_reason: str | int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.finish_reason != "error"
