"""What the engine hands back for each request."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

FinishReason = Literal["stop", "length", "error"]


@dataclass(frozen=True)
class Logprob:
    """vLLM's ``Logprob``: one token's log-probability at a position, its rank in that position's
    distribution (1 = most likely) and its text (``tokenizer.decode([token_id])``)."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


# vLLM's shapes: per position, a dict from token id to its Logprob. A sampled position holds the
# sampled token first, then the top-k alternatives (k entries, or k + 1 when the sampled token is
# not among them); ``prompt_logprobs`` starts with None (the first prompt token has no context).
PositionLogprobs = dict[int, Logprob]
SampleLogprobs = list[PositionLogprobs]
PromptLogprobs = list[PositionLogprobs | None]


@dataclass(frozen=True)
class TokenLogprob:
    """The sampler's record of one position: the chosen (or prompt) token, its log-prob and rank,
    and the top alternatives as (token id, log-prob), best first. ``Logprob`` dicts are built from it."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()
    rank: int = 1


@dataclass(frozen=True)
class CompletionOutput:
    """One sample of a request (vLLM's ``CompletionOutput``): ``RequestOutput.outputs[i]``."""

    index: int
    text: str
    token_ids: tuple[int, ...]
    finish_reason: FinishReason
    stop_reason: str | int | None = None
    logprobs: SampleLogprobs | None = None
    error: str | None = None

    @property
    def cumulative_logprob(self) -> float | None:
        """Sum of the sampled tokens' log-probs (in the engine's ``logprobs_mode``), as vLLM's."""
        return cumulative(self.logprobs, self.token_ids)


def cumulative(logprobs: SampleLogprobs | None, token_ids: tuple[int, ...]) -> float | None:
    if logprobs is None:
        return None
    return sum(position[token].logprob for position, token in zip(logprobs, token_ids))


@dataclass(frozen=True)
class RequestOutput:
    """The result of one finished request.

    ``index`` is the request's position in the ``generate`` call; ``request_id`` is the caller's id
    (or ``str(index)``). On ``finish_reason == "error"`` the text is empty and ``error`` says why.
    With ``n > 1`` samples, the flat fields (``text``, ``token_ids``, ``finish_reason``, ...) are
    sample 0's, ``outputs`` lists all of them, ``num_output_tokens`` counts all of them, and the prompt
    is counted once (``num_prompt_tokens``, ``num_cached_tokens`` as sample 0 saw them).
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
    logprobs: SampleLogprobs | None = None
    prompt_logprobs: PromptLogprobs | None = (
        None  # SamplingParams.prompt_logprobs: [None, {id: Logprob}, ...]
    )
    time_to_first_token: float | None = None
    latency: float = 0.0
    stop_reason: str | int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    samples: tuple[CompletionOutput, ...] = ()  # n > 1: every sample; the flat fields are sample 0's
    prompt: str | None = None  # the prompt text, when it was given as text

    @property
    def ok(self) -> bool:
        return self.finish_reason != "error"

    @property
    def finished(self) -> bool:
        return True  # outputs are handed back only once their request is done

    @property
    def outputs(self) -> list[CompletionOutput]:
        """vLLM's shape: one ``CompletionOutput`` per sample (``outputs[0].text`` is ``text``)."""
        if self.samples:
            return list(self.samples)
        return [
            CompletionOutput(
                0, self.text, self.token_ids, self.finish_reason, self.stop_reason, self.logprobs, self.error
            )
        ]
