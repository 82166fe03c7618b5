"""``speculative_config``: vLLM's shape, validated when the engine config is built (torch-free)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Literal

SpecMethod = Literal["ngram", "draft_model"]
METHODS: tuple[str, ...] = ("ngram", "draft_model")
AUTO: Literal["auto"] = "auto"


@dataclass(frozen=True)
class SpeculativeConfig:
    """How the engine speculates.

    ``num_speculative_tokens`` is a fixed k, or ``"auto"`` (the default): the policy picks k per
    request and step in ``[0, max_speculative_tokens]`` from the measured step cost and each request's
    acceptance, and speculates only where that beats plain decoding. ``prompt_lookup_min/max`` bound
    the n-gram lengths the lookup tries (longest first). ``model`` is the draft model (a preset, an HF
    directory or a .gguf path) for ``method="draft_model"``; it must share the target's tokenizer.
    ``jump_forward`` (n-gram only): a structured-output request drafts what its grammar forces (keys,
    quotes, separators), with the lookup continuing after it; verified like any draft (forced.py).
    ``prefill_drafts`` (n-gram only): the step that computes a request's last prompt chunk also
    verifies drafts of its first output tokens (decoder.py ``prefill_drafts``).
    ``cross_request`` (n-gram only): where the request's own lookup runs short, continue with what
    followed the same n-grams in the outputs of the engine's other requests (output_pool.py); None
    turns it on with ``auto`` k (the policy prices its drafts by their own acceptance) and off with a
    fixed k. ``cross_request_requests`` bounds how many requests' outputs it keeps, and
    ``cross_request_min_probability`` is the share of an n-gram's followers a drafted token must hold.
    """

    method: SpecMethod = "ngram"
    num_speculative_tokens: int | Literal["auto"] = AUTO
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 5
    model: str | None = None
    max_speculative_tokens: int = 8
    draft_kv_blocks: int | None = None  # the draft's own pool; None: sized like the target's
    jump_forward: bool = True
    prefill_drafts: bool = True
    cross_request: bool | None = None
    cross_request_requests: int = 256
    cross_request_min_probability: float = 0.5

    def __post_init__(self) -> None:
        def bad(name: str, allowed: str) -> ValueError:
            return ValueError(
                f"speculative_config.{name}={getattr(self, name)!r} is invalid; expected {allowed}"
            )

        if self.method not in METHODS:
            raise bad("method", f"one of {', '.join(METHODS)}")
        k = self.num_speculative_tokens
        if k != AUTO and (isinstance(k, bool) or not isinstance(k, int) or k < 0):
            raise bad("num_speculative_tokens", "'auto' or an integer >= 0 (0 turns speculation off)")
        for name in ("prompt_lookup_min", "prompt_lookup_max", "max_speculative_tokens"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise bad(name, "a positive integer")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise bad("prompt_lookup_min", f"<= prompt_lookup_max ({self.prompt_lookup_max})")
        if self.method == "draft_model" and not self.model:
            raise ValueError(
                "speculative_config.method='draft_model' needs speculative_config.model (a preset name, an HF "
                "directory or a .gguf path of a smaller model with the target's tokenizer)"
            )
        if self.method == "ngram" and self.model is not None:
            raise bad("model", "None for method='ngram' (only a draft model loads weights)")
        for name in ("jump_forward", "prefill_drafts"):
            if not isinstance(getattr(self, name), bool):
                raise bad(name, "true or false")
        if self.cross_request is not None and not isinstance(self.cross_request, bool):
            raise bad("cross_request", "true, false or null (on with auto k)")
        if self.method != "ngram" and self.cross_request:
            raise bad("cross_request", "false or null for method='draft_model' (it is a lookup)")
        requests = self.cross_request_requests
        if isinstance(requests, bool) or not isinstance(requests, int) or requests < 1:
            raise bad("cross_request_requests", "a positive integer")
        p = self.cross_request_min_probability
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 < p <= 1.0:
            raise bad("cross_request_min_probability", "a number in (0, 1]")
        if self.draft_kv_blocks is not None and self.draft_kv_blocks < 2:
            raise bad("draft_kv_blocks", "None or at least 2")

    @property
    def auto(self) -> bool:
        return self.num_speculative_tokens == AUTO

    @property
    def uses_cross_request(self) -> bool:
        """Whether the lookup continues in other requests' outputs (``cross_request``, resolved)."""
        if self.method != "ngram":
            return False
        return self.auto if self.cross_request is None else self.cross_request

    @property
    def max_k(self) -> int:
        """The most draft tokens one request gets in one step."""
        k = self.num_speculative_tokens
        return self.max_speculative_tokens if k == AUTO else int(k)

    @classmethod
    def parse(cls, value: SpeculativeConfig | Mapping[str, Any]) -> SpeculativeConfig:
        """A config from a mapping (Python, job YAML); unknown keys are named, with the valid ones."""
        if isinstance(value, SpeculativeConfig):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"speculative_config must be a mapping such as {{'method': 'ngram'}}, got {type(value).__name__}"
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"speculative_config: unknown key(s) {unknown}; valid keys: {sorted(known)}")
        if "method" not in value:
            raise ValueError(f"speculative_config needs a 'method' (one of {', '.join(METHODS)})")
        return cls(**dict(value))
