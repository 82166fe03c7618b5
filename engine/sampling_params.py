"""Per-request sampling settings, validated without raising so that one bad request becomes an error output."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

MAX_N = 128  # samples per prompt; far beyond it, one request per sample is the better shape


def _finite_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SamplingParams:
    """How to decode one request.

    Defaults suit a batch user: greedy unless a temperature is given, and ``max_tokens=None`` means
    "until EOS or the model's context limit" (no surprise 16-token cap).
    """

    temperature: float = 0.0
    top_k: int = 0  # 0 or -1: off
    top_p: float = 1.0
    min_p: float = 0.0
    seed: int | None = None
    max_tokens: int | None = None
    min_tokens: int = 0
    stop: tuple[str, ...] | list[str] | str | None = None
    stop_token_ids: tuple[int, ...] | list[int] = field(default_factory=tuple)
    ignore_eos: bool = False
    logprobs: int | None = None  # None: none; 0: sampled token only; k: sampled plus top-k
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Penalties, as vLLM and the OpenAI API define them: ``repetition_penalty`` (> 0, 1 = off) divides
    # positive logits (multiplies negative ones) of every token already in the prompt or the output;
    # ``presence_penalty`` and ``frequency_penalty`` (in [-2, 2]) subtract a constant, and a multiple of
    # the count, from the logits of tokens already in the output.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1  # samples per prompt; they share the prompt's KV blocks (see LLM.generate)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        if isinstance(self.stop, str):
            return (self.stop,)
        return tuple(self.stop)

    def validation_error(self) -> str | None:
        """Return a message naming the first invalid field, or None when the params are usable."""
        if not _finite_number(self.temperature) or self.temperature < 0:
            return f"temperature must be >= 0, got {self.temperature!r}"
        if not isinstance(self.top_k, int) or self.top_k < -1:
            return f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}"
        if not _finite_number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            return f"top_p must be in (0, 1], got {self.top_p!r}"
        if not _finite_number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            return f"min_p must be in [0, 1], got {self.min_p!r}"
        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            return f"max_tokens must be a positive integer or None, got {self.max_tokens!r}"
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            return f"min_tokens must be a non-negative integer, got {self.min_tokens!r}"
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            return f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
        if self.logprobs is not None and (not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20):
            return f"logprobs must be None or an integer in [0, 20], got {self.logprobs!r}"
        if self.seed is not None and not isinstance(self.seed, int):
            return f"seed must be an integer or None, got {self.seed!r}"
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            return f"stop must be non-empty strings, got {self.stop!r}"
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _finite_number(value) or not -2.0 <= value <= 2.0:
                return f"{name} must be in [-2, 2], got {value!r}"
        if not _finite_number(self.repetition_penalty) or self.repetition_penalty <= 0:
            return f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty!r}"
        if isinstance(self.n, bool) or not isinstance(self.n, int) or not 1 <= self.n <= MAX_N:
            return f"n must be an integer in [1, {MAX_N}], got {self.n!r}"
        if any(not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            return f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}"
        return None
