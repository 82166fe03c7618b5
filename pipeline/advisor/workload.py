"""The job's token workload: prompt and output length distributions of the sample, the requests the
engine would run (with the prefix-cache hits prefix ordering gives), and totals projected to the input."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from prefixflow.pipeline.advisor.memory import Footprint
from prefixflow.pipeline.advisor.render import Rendered
from prefixflow.pipeline.advisor.sharing import Sharing

UNBOUNDED_OUTPUT_GUESS = 256  # output tokens assumed per request when max_tokens is unset and no pilot ran


@dataclass(frozen=True)
class Dist:
    n: int
    mean: float
    p50: int
    p90: int
    p99: int
    max: int
    std: float = 0.0

    @classmethod
    def of(cls, values: list[int]) -> Dist:
        if not values:
            return cls(0, 0.0, 0, 0, 0, 0)
        v = sorted(values)

        def q(f: float) -> int:
            return v[min(len(v) - 1, int(f * len(v)))]

        mean = sum(v) / len(v)
        std = (sum((x - mean) ** 2 for x in v) / len(v)) ** 0.5
        return cls(len(v), mean, q(0.5), q(0.9), q(0.99), v[-1], std)

    @property
    def cv(self) -> float:
        """Coefficient of variation (std / mean): 0 for equal values."""
        return self.std / self.mean if self.mean else 0.0


@dataclass(frozen=True)
class PilotResult:
    """What a pilot run on real rows measured (see pilot.py)."""

    rows: int
    output_tokens: list[int]  # per generated request
    output_caps: list[int | None]  # the same requests' max_tokens
    finish_reasons: dict[str, int]
    elapsed_s: float
    prompt_tokens: int
    cached_tokens: int
    generated_tokens: int
    preemptions: int
    device: str
    requests: list[tuple[int, int, int]] = field(default_factory=list)  # per row: prompt, output, cached
    # n-gram speculation replayed over the pilot's outputs (advisor/speculation.py): drafts, accepted, steps
    ngram_replay: tuple[int, int, int] = (0, 0, 0)
    # of those drafts, the ones a structured-output grammar forced (jump-forward): proposed, accepted
    forced_replay: tuple[int, int] = (0, 0)

    @property
    def tokens_per_s(self) -> float:
        return (
            (self.prompt_tokens - self.cached_tokens + self.generated_tokens) / self.elapsed_s
            if self.elapsed_s
            else 0.0
        )

    @property
    def hit_rate(self) -> float:
        return self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


@dataclass
class Workload:
    total_rows: int
    sampled_rows: int
    good_rows: int
    errors_by_class: dict[str, int]
    error_examples: dict[str, str]
    prompt: Dist  # tokens per row as the engine gets them (map_reduce: all chunks)
    output_cap: Dist  # max_tokens of rows that set one
    unbounded_rows: int  # rows without max_tokens
    output_expected: Dist  # per request
    output_source: str  # "max_tokens" | "pilot" | "guess" | "scoring"
    requests: list[tuple[int, int, int]]  # (prompt_len, expected output_len, cached prompt tokens)
    scale: float  # input rows per sampled row
    pilot: PilotResult | None = None
    notes: list[str] = field(default_factory=list)

    def footprint(self, shared_blocks: int) -> Footprint:
        """Each running sequence's own KV (prompt + expected output - prefix-cache hits): mean and p99."""
        sizes = sorted(p + o - c for p, o, c in self.requests) or [1]
        return Footprint(
            sum(sizes) / len(sizes),
            float(sizes[min(len(sizes) - 1, int(0.99 * len(sizes)))]),
            shared_blocks,
            self.output_source != "scoring",
        )

    @property
    def projected(self) -> dict[str, int]:
        prompt = sum(r[0] for r in self.requests)
        cached = sum(r[2] for r in self.requests)
        output = sum(r[1] for r in self.requests)
        s = self.scale
        return {
            "rows": self.total_rows,
            "requests": round(len(self.requests) * s),
            "error_rows": round(sum(self.errors_by_class.values()) * s),
            "prompt_tokens": round(prompt * s),
            "cached_prompt_tokens": round(cached * s),
            "computed_prompt_tokens": round((prompt - cached) * s),
            "output_tokens": round(output * s),
            "total_tokens": round((prompt + output) * s),
        }

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in asdict(self).items() if k not in ("requests", "pilot")}
        d["projected"] = self.projected
        d["requests_sampled"] = len(self.requests)
        if self.pilot is not None:
            d["pilot"] = {
                **asdict(self.pilot),
                "output_tokens": Dist.of(self.pilot.output_tokens).__dict__,
                "tokens_per_s": self.pilot.tokens_per_s,
                "prefix_hit_rate": self.pilot.hit_rate,
            }
            d["pilot"].pop("output_caps")
            d["pilot"].pop("requests")
        return d


def build_workload(
    rendered: Rendered, sharing: Sharing, total_rows: int, max_model_len: int, pilot: PilotResult | None
) -> Workload:
    """Expected output per request: 1 for label scoring; with a pilot, each cap scaled by the measured
    share of caps actually generated (EOS stops rows early); otherwise the cap (an upper bound), or a
    guess of ``UNBOUNDED_OUTPUT_GUESS`` where no cap is set. Never beyond the context limit."""
    notes: list[str] = []
    ratio, unbounded_guess = 1.0, float(UNBOUNDED_OUTPUT_GUESS)
    capped = [(o, c) for o, c in zip(pilot.output_tokens, pilot.output_caps) if c] if pilot else []
    if capped:
        ratio = sum(o for o, _ in capped) / sum(c for _, c in capped)
    if pilot and pilot.output_tokens:
        unbounded_guess = sum(pilot.output_tokens) / len(pilot.output_tokens)
    kinds = {r.kind for r in rendered.requests}
    source = "scoring" if kinds == {"score"} else "pilot" if pilot and pilot.output_tokens else "max_tokens"
    unbounded = sum(1 for m in rendered.max_tokens if m is None)
    if unbounded and source == "max_tokens":
        source = "guess"
        notes.append(
            f"{unbounded} sampled rows set no max_tokens: they run until EOS or the context limit; "
            f"{UNBOUNDED_OUTPUT_GUESS} output tokens assumed for them (measure with --pilot N)"
        )
    requests: list[tuple[int, int, int]] = []
    outputs: list[int] = []
    ends = [len(s) for s in rendered.suffixes] or [0]
    cached = iter(sharing.cached_tokens)  # prompt by prompt, suffixes in order (sharing.analyze)
    for req in rendered.requests:
        for extra in ends:
            n = len(req.tokens) + extra
            if req.kind == "score":
                out = 1
            elif req.max_tokens is None:
                out = round(unbounded_guess)
            else:
                out = round(req.max_tokens * ratio)
            out = max(1, min(out, max_model_len - n)) if max_model_len > n else 1
            requests.append((n, out, min(next(cached), n - 1)))
            outputs.append(out)
    return Workload(
        total_rows=total_rows,
        sampled_rows=rendered.rows,
        good_rows=rendered.good_rows,
        errors_by_class=rendered.errors_by_class,
        error_examples=rendered.error_examples,
        prompt=Dist.of(rendered.prompt_tokens),
        output_cap=Dist.of([m for m in rendered.max_tokens if m is not None]),
        unbounded_rows=unbounded,
        output_expected=Dist.of(outputs),
        output_source=source,
        requests=requests,
        scale=total_rows / rendered.rows if rendered.rows else 0.0,
        pilot=pilot,
        notes=notes,
    )
