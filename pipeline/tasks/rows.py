"""Turn one input row into an engine request (token ids + sampling params) or an error row.

Prompts go to the engine as token ids we counted ourselves, so the context-limit check here is
exact and the long-document policies (truncate / map_reduce) act on the same tokens the engine sees.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from prefixflow.pipeline.engine_access import Engine, Tokenizer
from prefixflow.pipeline.errors import (
    BAD_SAMPLING,
    DUPLICATE_ID,
    NULL_ID,
    PROMPT_TOO_LONG,
    TEMPLATE_ERROR,
    JobConfigError,
    RowError,
)
from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.prompts.render import (
    as_text,
    chat_renderer,
    chat_wrapper,
    check_nonempty,
    conversation,
    render_template,
)
from prefixflow.pipeline.tasks.constraints import job_constraint

if TYPE_CHECKING:
    from prefixflow.pipeline.tasks.base import Task

INT_PARAMS = {"top_k", "seed", "max_tokens", "min_tokens", "logprobs", "n"}
FLOAT_PARAMS = {
    "temperature",
    "top_p",
    "min_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
}


@dataclass
class Prepared:
    """A row ready for the engine. ``chunks`` is set instead of ``prompt`` for map_reduce rows."""

    base: dict[str, Any]
    row: dict[str, Any]
    params: Any
    prompt: list[int] | None = None
    chunks: list[list[int]] = field(default_factory=list)

    @property
    def prompt_ids(self) -> list[int]:
        """The prompt of a single-request row (every row but map_reduce ones)."""
        if self.prompt is None:
            raise ValueError("a map_reduce row has chunks, not one prompt")
        return self.prompt


def max_tokens_problem(max_tokens: int, max_model_len: int) -> str:
    return (
        f"max_tokens is {max_tokens} but the model's context length (max_model_len) is {max_model_len}: "
        "prompt and output must fit in it together; set max_tokens below the context length"
    )


def check_max_tokens(cfg: JobConfig, max_model_len: int) -> None:
    """Fail fast when the job's own max_tokens leaves no room for any prompt (every row would fail)."""
    value = cfg.sampling.max_tokens
    if value is not None and value >= max_model_len:
        raise JobConfigError(f"job config: sampling.max_tokens: {max_tokens_problem(value, max_model_len)}")


def check_sampling_vocabulary(cfg: JobConfig, vocab_size: int) -> None:
    """Fail fast when a job-wide sampling value lies outside the model's vocabulary (every row would fail)."""
    problem = cfg.sampling.problem(vocab_size)
    if problem:
        raise JobConfigError(f"job config: sampling: {problem}")


def derived_id(relpath: str, row_index: int) -> str:
    return f"{relpath}#{row_index}"


class RowPreparer:
    """Per-shard helper holding the tokenizer, chat wrapper and limits (built once, used per row)."""

    def __init__(
        self,
        cfg: JobConfig,
        llm: Engine,
        duplicates: Mapping[tuple[str, int], tuple[str, int] | None],
        task: Task,
    ) -> None:
        self.cfg = cfg
        self.task = task
        self.tok: Tokenizer = llm.tokenizer
        self.duplicates = duplicates
        self.wrap: Callable[[str], str] | None = chat_wrapper(llm, cfg.chat, cfg.system_prompt)
        self.render_chat: Callable[[list[dict[str, str]]], str] | None = None
        if cfg.messages_column:
            try:
                self.render_chat = chat_renderer(llm, cfg.system_prompt)
            except ValueError as exc:
                raise JobConfigError(f"job config: messages_column: {exc}") from exc
        self.max_len = int(llm.max_model_len)
        self.vocab_size = int(llm.vocab_size)
        self.constraint = job_constraint(cfg, task)  # built once per shard: the engine caches its grammar
        self.base_params = cfg.sampling.params(self.constraint)  # rows without sampling columns share it
        self.base_problem = self.base_params.validation_error(self.vocab_size)
        self.template = task.template(cfg)
        self.document_column = task.document_column(cfg)
        self.long_documents = task.long_documents(cfg)  # None: a prompt over the context is an error row
        self.reserve = task.reserve_tokens(cfg, self.tok)
        self.parse_output = task.output_parser(cfg)  # built once per shard (an extract job's validator)

    # -- ids and sampling -------------------------------------------------------------------
    def row_id(self, row: dict[str, Any], relpath: str, key: int) -> str:
        col = self.cfg.id_column
        if not col:
            return derived_id(relpath, key)
        value = row.get(col)
        if value is None:
            raise RowError(NULL_ID, f"id column {col!r} is null (row {derived_id(relpath, key)})")
        if isinstance(value, bytes):
            value = value.decode("utf-8", errors="replace")
        return str(value)

    def check_duplicate(self, relpath: str, key: int, row_id: str) -> None:
        if (relpath, key) in self.duplicates:
            first = self.duplicates[(relpath, key)]
            earlier = f"row {first[1]} of {first[0]} ({derived_id(*first)})" if first else "an earlier row"
            raise RowError(
                DUPLICATE_ID,
                f"id {row_id!r} is already used by {earlier}; ids must be unique, so this row was not run",
            )

    def params(self, row: dict[str, Any]) -> Any:
        """The row's SamplingParams: the job's, with the row's own sampling columns (checked here, so a
        bad value is this row's error, against the model's vocabulary too)."""
        if not self.cfg.sampling_columns:
            if self.base_problem:
                raise RowError(BAD_SAMPLING, self.base_problem)
            return self.base_params
        values: dict[str, Any] = {}
        for name, col in self.cfg.sampling_columns.items():
            value = row.get(col)
            if value is None:
                continue
            try:
                if name in INT_PARAMS:
                    if isinstance(value, float) and not value.is_integer():
                        raise ValueError(f"{value!r} is not a whole number")
                    value = int(value)
                elif name in FLOAT_PARAMS:
                    value = float(value)
            except (TypeError, ValueError) as exc:
                raise RowError(
                    BAD_SAMPLING, f"column {col!r} ({name}) has a bad value {value!r}: {exc}"
                ) from exc
            values[name] = tuple(value) if isinstance(value, list) else value
        params = replace(self.base_params, **values)
        problem = params.validation_error(self.vocab_size)  # vocabulary-bound values too, before the engine
        if problem:
            raise RowError(BAD_SAMPLING, problem)
        return params

    # -- prompts --------------------------------------------------------------------------------
    def _column_text(self, row: dict[str, Any], col: str) -> str:
        if col not in row:
            raise RowError(TEMPLATE_ERROR, f"column {col!r} is not in the input file")
        return as_text(row[col], f"column {col!r}")

    def _render(self, row: dict[str, Any], document: str | None) -> str:
        if self.template is None:
            return document if document is not None else self._column_text(row, self.cfg.prompt_column or "")
        ctx = dict(row)
        if document is not None:  # reachable as {{ document }} and by its column name, both shortened
            ctx["document"] = document
            ctx[self.document_column or "document"] = document
        return render_template(self.template, ctx, self.cfg.template_limits)

    def encode(self, user_text: str, allow_blank: bool = False) -> list[int]:
        if not allow_blank:
            check_nonempty(user_text)
        if self.wrap:
            return self.tok.encode(self.wrap(user_text), add_special_tokens=False)
        if self.cfg.system_prompt:  # no chat template: the system prompt leads as plain text
            user_text = f"{self.cfg.system_prompt}\n\n{user_text}"
        return self.tok.encode(user_text, add_special_tokens=True)

    def encode_reference(self, user_text: str) -> list[int]:
        """A label-calibration reference prompt (label_references), wrapped like the rows' prompts."""
        if self.render_chat is not None and self.template is None and not self.cfg.prompt_column:
            return list(
                self.tok.encode(
                    self.render_chat([{"role": "user", "content": user_text}]), add_special_tokens=False
                )
            )
        return self.encode(user_text, allow_blank=True)

    def encode_messages(self, row: dict[str, Any]) -> list[int] | None:
        """The row's conversation through the chat template, or None when the row has no messages and
        the job names a ``prompt_column`` to fall back on."""
        col = self.cfg.messages_column
        if col is None or self.render_chat is None:
            return None
        if col not in row:
            raise RowError(TEMPLATE_ERROR, f"column {col!r} is not in the input file")
        if row[col] is None and self.cfg.prompt_column:
            return None
        messages = conversation(row[col], f"column {col!r}")
        return list(self.tok.encode(self.render_chat(messages), add_special_tokens=False))

    def budget(self, params: Any) -> int:
        """Prompt tokens left after the output: raises a bad_sampling RowError when none are left."""
        output = int(params.max_tokens or 0)
        if output >= self.max_len:
            raise RowError(BAD_SAMPLING, max_tokens_problem(output, self.max_len))
        return self.max_len - max(output, self.reserve)

    def prepare(self, row: dict[str, Any], base: dict[str, Any], relpath: str, key: int) -> Prepared:
        """Raises RowError for a bad row; otherwise returns a request (or map_reduce chunks)."""
        self.check_duplicate(relpath, key, base["id"])
        params = self.params(row)
        budget = self.budget(params)
        document = None
        if self.document_column is not None:
            document = self._column_text(row, self.document_column)
            check_nonempty(document)
        chat_ids = self.encode_messages(row)
        ids = chat_ids if chat_ids is not None else self.encode(self._render(row, document))
        if len(ids) <= budget:
            return Prepared(base, row, params, prompt=ids)
        policy = self.long_documents.long_document if self.long_documents is not None else "error"
        too_long = (
            f"prompt has {len(ids)} tokens; the limit is {budget} (context {self.max_len} minus output)"
        )
        if policy == "error" or document is None or self.long_documents is None:
            raise RowError(PROMPT_TOO_LONG, too_long)
        doc_ids = self.tok.encode(document, add_special_tokens=False)
        overhead = len(ids) - len(doc_ids)
        room = budget - overhead - 2
        if room < 8:
            raise RowError(PROMPT_TOO_LONG, too_long + "; the template alone leaves no room for the document")
        if policy == "truncate":
            prompt = self.fit(row, doc_ids, room, budget)
            base["truncated"] = True
            return Prepared(base, row, params, prompt=prompt)
        size = min(room, self.long_documents.chunk_tokens or room)
        pieces = [doc_ids[i : i + size] for i in range(0, len(doc_ids), size)]
        return Prepared(base, row, params, chunks=[self.fit(row, p, room, budget) for p in pieces])

    def fit(self, row: dict[str, Any], doc_ids: list[int], room: int, budget: int) -> list[int]:
        """Render with the document cut to ``room`` tokens (head, tail or both), shrinking until it fits:
        decode/encode round trips can change token counts slightly."""
        side = self.long_documents.truncate_side if self.long_documents is not None else "head"
        for _ in range(6):
            if len(doc_ids) <= room:
                kept = doc_ids
            elif side == "head":
                kept = doc_ids[:room]
            elif side == "tail":
                kept = doc_ids[-room:]
            else:
                kept = (
                    doc_ids[: room // 2]
                    + self.tok.encode(" ... ", add_special_tokens=False)
                    + doc_ids[-(room // 2) :]
                )
            ids = self.encode(self._render(row, self.tok.decode(kept)))
            if len(ids) <= budget:
                return ids
            room -= max(4, len(ids) - budget)
        raise RowError(PROMPT_TOO_LONG, f"could not fit the document into {budget} tokens")

    def reduce_prompt(self, row: dict[str, Any], summaries: list[str], params: Any) -> list[int] | None:
        """The reduce step's prompt, or None when the joined summaries are still too long."""
        template = self.long_documents.reduce_template if self.long_documents is not None else None
        if template is None:
            raise RowError(TEMPLATE_ERROR, "summarize.reduce_template is not set")
        text = render_template(template, {**row, "summaries": "\n".join(summaries)}, self.cfg.template_limits)
        ids = self.encode(text)
        return ids if len(ids) <= self.budget(params) else None
