"""Q5's evidence from a pilot: how often n-gram speculation (with grammar-forced drafts) would have
been right on this job.

A verified run emits exactly the tokens the model produces without speculation, so replaying the
engine's own proposers over the pilot's prompts and output token ids gives the acceptance, and the
tokens per step, that ``speculative: {method: ngram}`` would measure on these rows
(engine/speculative/replay.py). ``Recorder`` stands in for the engine during the pilot to keep those
token ids (a re-encoding of the output text would hide how the model splits forced literals).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

REPLAY_K = 4  # drafts per step, vLLM's usual num_speculative_tokens (engine/speculative/replay.py)


class Recorder:
    """The pilot's engine, passed through; every generated output is kept with its request's params."""

    def __init__(self, llm: Any) -> None:
        self._llm = llm
        self.finished: list[tuple[Sequence[int], Sequence[int], Any]] = []  # prompt, output, structured

    def __getattr__(self, name: str) -> Any:
        return getattr(self._llm, name)

    def generate_stream(self, prompts: Any, params: Any = None, request_ids: Any = None) -> Iterator[Any]:
        listed = params if isinstance(params, Sequence) else None
        for out in self._llm.generate_stream(prompts, params, request_ids):
            p = listed[out.index] if listed is not None and out.index < len(listed) else params
            if out.finish_reason != "error" and out.token_ids:
                self.finished.append((out.prompt_token_ids, out.token_ids, getattr(p, "structured", None)))
            yield out

    def generate(self, prompts: Any, params: Any = None, request_ids: Any = None) -> list[Any]:
        return sorted(self.generate_stream(prompts, params, request_ids), key=lambda o: o.index)


def replay(llm: Any, finished: list[tuple[Sequence[int], Sequence[int], Any]]) -> tuple[int, ...]:
    """(drafts proposed, accepted, decode steps, forced drafts proposed, forced accepted) over the
    recorded requests, in the order they finished."""
    from prefixflow.pipeline.engine_access import SpeculationReplay  # the engine's own proposers (lazy)

    r = SpeculationReplay(llm, k=REPLAY_K)
    for prompt, output, structured in finished:
        r.add(prompt, output, structured)
    c = r.counts
    return c.proposed, c.accepted, c.steps, c.forced_proposed, c.forced_accepted
