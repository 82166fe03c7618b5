"""Per-request sampling settings, validated without raising so that one bad request becomes an error output."""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property

from prefixflow.engine.structured.params import StructuredOutputs

MAX_LOGPROBS = 20
GREEDY_BELOW = 1e-5  # temperatures under this sample as greedy (dividing by them overflows the logits)
MAX_N = 128  # samples per prompt; far beyond it, one request per sample is the better shape


def _number(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


def _integer(value: object) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    """How to decode one request.

    Defaults suit a batch user: greedy unless a temperature is given, and ``max_tokens=None`` means
    "until EOS or the model's context limit" (no surprise 16-token cap). A ``top_k`` above the
    vocabulary keeps every token (as transformers does).
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
    prompt_logprobs: int | None = None  # the same for each prompt token after the first
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    structured: StructuredOutputs | None = None  # constrain the output (JSON schema, regex, choice, grammar)
    # Penalties, as vLLM and the OpenAI API define them: ``repetition_penalty`` (> 0, 1 = off) divides
    # positive logits (multiplies negative ones) of every token already in the prompt or the output;
    # ``presence_penalty`` and ``frequency_penalty`` (in [-2, 2]) subtract a constant, and a multiple of
    # the count, from the logits of tokens already in the output.
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    n: int = 1  # samples per prompt; they share the prompt's KV blocks (see LLM.generate)
    # Logit bias, as vLLM and the OpenAI API define it: token id -> a value added to that token's logit at
    # every generated position, before the structured-output mask, penalties, bans and temperature (so
    # ``logprobs_mode="processed"`` includes it, ``"raw"`` does not). A large negative value bans a token.
    logit_bias: Mapping[int, float] | None = None

    @property
    def greedy(self) -> bool:
        return float(self.temperature) < GREEDY_BELOW

    @property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0.0 or self.frequency_penalty != 0.0 or self.repetition_penalty != 1.0

    @cached_property
    def logit_bias_items(self) -> tuple[tuple[int, ...], tuple[float, ...]]:
        """``logit_bias`` as (token ids, values), ordered by id: what the sampler adds each step."""
        items = sorted((self.logit_bias or {}).items())
        return tuple(int(t) for t, _ in items), tuple(float(v) for _, v in items)

    @property
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        if isinstance(self.stop, str):
            return (self.stop,)
        return tuple(self.stop)

    def validation_error(self, vocab_size: int | None = None) -> str | None:
        """Return a message naming the first invalid field, or None when the params are usable.

        With ``vocab_size`` (the engine passes its model's), token ids and the number of log-prob
        alternatives are also checked against the vocabulary. Never raises.
        """
        if not _number(self.temperature) or self.temperature < 0:
            return f"temperature must be a finite number >= 0, got {self.temperature!r}"
        if not _integer(self.top_k) or self.top_k < -1:
            return f"top_k must be -1, 0 (off) or a positive integer, got {self.top_k!r}"
        if not _number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            return f"top_p must be in (0, 1], got {self.top_p!r}"
        if not _number(self.min_p) or not 0.0 <= self.min_p <= 1.0:
            return f"min_p must be in [0, 1], got {self.min_p!r}"
        if self.max_tokens is not None and (not _integer(self.max_tokens) or self.max_tokens < 1):
            return f"max_tokens must be a positive integer or None, got {self.max_tokens!r}"
        if not _integer(self.min_tokens) or self.min_tokens < 0:
            return f"min_tokens must be a non-negative integer, got {self.min_tokens!r}"
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            return f"min_tokens ({self.min_tokens}) must not exceed max_tokens ({self.max_tokens})"
        for name in ("logprobs", "prompt_logprobs"):
            value = getattr(self, name)
            if value is not None and (not _integer(value) or not 0 <= value <= MAX_LOGPROBS):
                return f"{name} must be None or an integer in [0, {MAX_LOGPROBS}], got {value!r}"
            if vocab_size is not None and value is not None and value > vocab_size:
                return f"{name} ({value}) exceeds the vocabulary size {vocab_size}"
        if self.seed is not None and not _integer(self.seed):
            return f"seed must be an integer or None, got {self.seed!r}"
        if not (self.stop is None or isinstance(self.stop, (str, list, tuple))):
            return f"stop must be a string, a list of strings or None, got {self.stop!r}"
        if any(not isinstance(s, str) or not s for s in self.stop_strings):
            return f"stop must be non-empty strings, got {self.stop!r}"
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            if not _number(value) or not -2.0 <= value <= 2.0:
                return f"{name} must be in [-2, 2], got {value!r}"
        if not _number(self.repetition_penalty) or self.repetition_penalty <= 0:
            return f"repetition_penalty must be > 0 (1 = off), got {self.repetition_penalty!r}"
        if not _integer(self.n) or not 1 <= self.n <= MAX_N:
            return f"n must be an integer in [1, {MAX_N}], got {self.n!r}"
        if not isinstance(self.stop_token_ids, (list, tuple)):
            return f"stop_token_ids must be a list of token ids, got {self.stop_token_ids!r}"
        if any(not _integer(t) or t < 0 for t in self.stop_token_ids):
            return f"stop_token_ids must be non-negative integers, got {self.stop_token_ids!r}"
        if vocab_size is not None and any(t >= vocab_size for t in self.stop_token_ids):
            bad = next(t for t in self.stop_token_ids if t >= vocab_size)
            return f"stop_token_ids holds {bad}, outside the vocabulary [0, {vocab_size})"
        problem = _logit_bias_error(self.logit_bias, vocab_size)
        if problem:
            return problem
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            if not isinstance(getattr(self, name), bool):
                return f"{name} must be true or false, got {getattr(self, name)!r}"
        return self._structured_error()

    def _structured_error(self) -> str | None:
        """Malformed constraints; whether one compiles is the engine's check (it needs the grammar engine)."""
        if self.structured is None:
            return None
        if not isinstance(self.structured, StructuredOutputs):
            return f"structured must be a StructuredOutputs, got {type(self.structured).__name__}"
        problem = self.structured.validation_error()
        if problem:
            return f"structured: {problem}"
        if self.ignore_eos:
            return "ignore_eos cannot be combined with structured: the grammar decides where the output ends"
        if self.min_tokens:
            return "min_tokens cannot be combined with structured: the grammar decides where the output ends"
        return None


def _logit_bias_error(bias: object, vocab_size: int | None) -> str | None:
    if bias is None:
        return None
    if not isinstance(bias, Mapping):
        return f"logit_bias must be a mapping of token id -> bias, got {type(bias).__name__}"
    for token, value in bias.items():
        if not _integer(token) or token < 0:
            hint = " (a string: convert the keys with int())" if isinstance(token, str) else ""
            return f"logit_bias keys must be non-negative integer token ids, got {token!r}{hint}"
        if vocab_size is not None and token >= vocab_size:
            return f"logit_bias holds token id {token}, outside the vocabulary [0, {vocab_size})"
        if not _number(value):
            return f"logit_bias values must be finite numbers, got {value!r} for token {token}"
    return None
