"""Turn sampled rows into the engine requests the job would make, exactly as a run prepares them.

The run's own ``RowPreparer`` does the work (template, chat wrapping, system prompt, tokenization,
context-limit checks, truncation and map_reduce chunking), handed a tokenizer-only stand-in for the
engine built from ``inspect_model``: the same tokens as a run, without weights or torch.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from prefixflow.pipeline.engine_access import Engine
from prefixflow.pipeline.errors import RowError
from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.storage.sample import Sample
from prefixflow.pipeline.tasks.registry import task_of
from prefixflow.pipeline.tasks.rows import RowPreparer, derived_id


class TokenizerOnlyModel:
    """What ``RowPreparer`` needs from an ``LLM``: ``tokenizer``, ``max_model_len``, ``vocab_size``,
    ``apply_chat_template``."""

    def __init__(self, card: Any, max_model_len: int) -> None:
        self.card = card
        self.tokenizer = card.tokenizer
        self.max_model_len = max_model_len
        self.vocab_size = card.vocab_size

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        return str(self.card.apply_chat_template(messages, add_generation_prompt=add_generation_prompt))


@dataclass(frozen=True)
class PlannedRequest:
    """One prompt for the engine: its tokens, its output cap (None: until EOS or the context limit) and the
    sampled row it serves. map_reduce makes one per chunk; label scoring one per row, which the engine
    runs once per label (``Rendered.suffixes``)."""

    tokens: list[int]
    max_tokens: int | None
    row: int
    kind: str  # "generate" | "score" | "map"


@dataclass
class Rendered:
    requests: list[PlannedRequest]
    rows: int  # sampled rows
    good_rows: int
    errors_by_class: dict[str, int] = field(default_factory=dict)
    error_examples: dict[str, str] = field(default_factory=dict)  # one message per class
    prompt_tokens: list[int] = field(default_factory=list)  # per good row (map_reduce: sum of chunks)
    max_tokens: list[int | None] = field(default_factory=list)  # per good row
    chunks_per_row: list[int] = field(default_factory=list)  # 1, or the map_reduce chunk count
    suffixes: list[list[int]] = field(default_factory=list)  # label scoring: each label's tokens


def render_sample(cfg: JobConfig, model: TokenizerOnlyModel, sample: Sample) -> Rendered:
    """Prepare every sampled row; bad rows are counted by error class, as a run would write them."""
    task = task_of(cfg)
    prep = RowPreparer(cfg, cast(Engine, model), {}, task)  # preparing rows uses no generation method
    choices = [model.tokenizer.encode(c, add_special_tokens=False) for c in task.scored_choices(cfg)]
    scoring = bool(choices)
    out = Rendered([], len(sample.rows), 0, suffixes=choices)
    errors: Counter[str] = Counter()
    for i, s in enumerate(sample.rows):
        base = {"id": derived_id(s.relpath, s.row_index)}
        try:
            base["id"] = prep.row_id(s.row, s.relpath, s.row_index)
            p = prep.prepare(s.row, base, s.relpath, s.row_index)
        except RowError as err:
            errors[err.error_class] += 1
            out.error_examples.setdefault(err.error_class, err.message)
            continue
        limit = p.params.max_tokens
        out.good_rows += 1
        out.max_tokens.append(limit)
        if p.prompt is not None:
            out.prompt_tokens.append(len(p.prompt))
            out.chunks_per_row.append(1)
            out.requests.append(
                PlannedRequest(p.prompt, 1 if scoring else limit, i, "score" if scoring else "generate")
            )
        else:
            out.prompt_tokens.append(sum(len(c) for c in p.chunks))
            out.chunks_per_row.append(len(p.chunks))
            out.requests += [PlannedRequest(c, limit, i, "map") for c in p.chunks]
    out.errors_by_class = dict(sorted(errors.items()))
    return out
