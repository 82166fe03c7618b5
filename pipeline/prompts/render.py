"""Prompt rendering: a sandboxed Jinja2 template (or a column) over one row, optionally chat-wrapped.

The sandbox matters because templates come from job configs that may be shared; StrictUndefined
makes a missing column a clear per-row error instead of a silently empty prompt.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jinja2
from jinja2 import meta, nodes

from prefixflow.pipeline.engine_access import Engine
from prefixflow.pipeline.errors import (
    BAD_TYPE,
    EMPTY_PROMPT,
    NULL_PROMPT,
    TEMPLATE_ERROR,
    TEMPLATE_LIMIT,
    UNDECODABLE_TEXT,
    RowError,
)
from prefixflow.pipeline.job.config import TemplateLimits
from prefixflow.pipeline.prompts.sandbox import ENV, TemplateLimitExceeded, compile_template, render_limited
from prefixflow.pipeline.prompts.template_cells import BlankCellPrinted, NullCellPrinted, cell_value


def parse_template(source: str) -> nodes.Template:
    """The template's syntax tree (the advisor reads which text is static and which comes from the row)."""
    return ENV.parse(source)


def template_columns(source: str) -> set[str]:
    """Names the template reads from the row (so only those columns are loaded)."""
    return set(meta.find_undeclared_variables(ENV.parse(source)))


def static_prefix(source: str | None) -> str:
    """The literal text before the template's first expression: what all rows' prompts share."""
    if not source:
        return ""
    cut = min((i for i in (source.find("{{"), source.find("{%")) if i >= 0), default=len(source))
    return source[:cut]


def as_text(value: Any, what: str) -> str:
    """Turn a cell into prompt text, classifying nulls, wrong types and undecodable bytes."""
    if value is None:
        raise RowError(NULL_PROMPT, f"{what} is null")
    if isinstance(value, bytes):
        try:
            value = value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RowError(UNDECODABLE_TEXT, f"{what} is not valid UTF-8: {exc}") from exc
    if not isinstance(value, str):
        raise RowError(BAD_TYPE, f"{what} must be text, got {type(value).__name__}")
    return value


def render_template(source: str, row: dict[str, Any], limits: TemplateLimits | None = None) -> str:
    """Render one row within ``limits`` (sandbox.py); every failure (missing column, sandbox violation,
    runtime error, a limit) is a RowError.

    A null or blank cell the template prints is a ``null_prompt`` / ``empty_prompt`` row error, unless
    the template handles it (see ``template_cells``)."""
    context = {k: cell_value(k, _decoded(v)) for k, v in row.items()}
    try:
        return render_limited(compile_template(source), context, limits or TemplateLimits())
    except TemplateLimitExceeded as exc:
        raise RowError(TEMPLATE_LIMIT, f"template stopped: {exc}") from exc
    except NullCellPrinted as exc:
        raise RowError(NULL_PROMPT, str(exc)) from exc
    except BlankCellPrinted as exc:
        raise RowError(EMPTY_PROMPT, str(exc)) from exc
    except jinja2.UndefinedError as exc:
        raise RowError(TEMPLATE_ERROR, f"template references a missing value: {exc}") from exc
    except Exception as exc:  # SecurityError, TypeError in filters, ...
        raise RowError(TEMPLATE_ERROR, f"template failed: {type(exc).__name__}: {exc}") from exc


def _decoded(value: Any) -> Any:
    if isinstance(value, bytes):
        try:
            return value.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise RowError(UNDECODABLE_TEXT, f"a template column is not valid UTF-8: {exc}") from exc
    return value


def check_nonempty(text: str) -> str:
    if not text.strip():
        raise RowError(EMPTY_PROMPT, "prompt is empty")
    return text


def chat_wrapper(llm: Engine, mode: str, system_prompt: str | None) -> Callable[[str], str] | None:
    """Return a function that wraps user text in the model's chat template, or None for plain prompts.

    ``auto`` uses the chat template when the model has one; ``on`` requires it (fails fast otherwise).
    """
    if mode == "off":
        return None
    tokenizer = getattr(llm, "tokenizer", None)
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if not has_template and mode == "auto":
        return None

    def wrap(text: str) -> str:
        messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
        messages.append({"role": "user", "content": text})
        return llm.apply_chat_template(messages, add_generation_prompt=True)

    try:
        wrap("probe")
    except Exception as exc:
        if mode == "on":
            raise ValueError(f"chat: on, but the model cannot apply a chat template: {exc}") from exc
        return None
    return wrap


CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")


def conversation(value: Any, what: str) -> list[dict[str, str]]:
    """A messages cell as chat messages: a list of ``{role, content}`` (Parquet ``list<struct<role,
    content>>``, or the same as JSON text). ``content`` is text or OpenAI-style parts, of which only
    ``{"type": "text"}`` parts are accepted (joined with newlines). Each problem is a RowError
    naming the message at fault."""
    if value is None:
        raise RowError(NULL_PROMPT, f"{what} is null")
    if isinstance(value, (str, bytes)):
        value = _json_messages(as_text(value, what), what)
    if not isinstance(value, (list, tuple)):
        raise RowError(
            BAD_TYPE, f"{what} must be a list of {{role, content}} messages, got {type(value).__name__}"
        )
    if not value:
        raise RowError(EMPTY_PROMPT, f"{what} has no messages")
    out = []
    for i, message in enumerate(value):
        where = f"{what}[{i}]"
        if not isinstance(message, dict):
            raise RowError(
                BAD_TYPE, f"{where} must be a {{role, content}} mapping, got {type(message).__name__}"
            )
        role = message.get("role")
        if role not in CHAT_ROLES:
            raise RowError(BAD_TYPE, f"{where}.role is {role!r}; expected one of: {', '.join(CHAT_ROLES)}")
        out.append({"role": role, "content": _content_text(message.get("content"), f"{where}.content")})
    if all(not m["content"].strip() for m in out):
        raise RowError(EMPTY_PROMPT, f"{what}: every message is empty")
    return out


def _json_messages(text: str, what: str) -> Any:
    import json

    try:
        return json.loads(text)
    except ValueError as exc:
        raise RowError(BAD_TYPE, f"{what} is text but not a JSON list of messages: {exc}") from exc


def _content_text(content: Any, where: str) -> str:
    if content is None:
        return ""  # an assistant turn with tool calls only, as chat templates accept
    if isinstance(content, (str, bytes)):
        return as_text(content, where)
    if isinstance(content, (list, tuple)):
        texts = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind != "text" or not isinstance(part.get("text"), str):
                raise RowError(
                    BAD_TYPE,
                    f"{where}[{j}] is not a text part ({{type: text, text: ...}}); "
                    "this engine reads text only",
                )
            texts.append(part["text"])
        return "\n".join(texts)
    raise RowError(BAD_TYPE, f"{where} must be text or a list of text parts, got {type(content).__name__}")


def chat_renderer(llm: Any, system_prompt: str | None) -> Callable[[list[dict[str, str]]], str]:
    """Render a whole conversation with the model's chat template (generation prompt added). The job's
    system prompt leads when the conversation brings none of its own. Raises ValueError when the
    model has no chat template: a messages column needs one."""

    def render(messages: list[dict[str, str]]) -> str:
        if system_prompt and not any(m["role"] in ("system", "developer") for m in messages):
            messages = [{"role": "system", "content": system_prompt}, *messages]
        return str(llm.apply_chat_template(messages, add_generation_prompt=True))

    try:
        render([{"role": "user", "content": "probe"}])
    except Exception as exc:
        raise ValueError(f"messages_column needs a model with a chat template: {exc}") from exc
    return render


def plain_conversation(messages: list[dict[str, str]]) -> str:
    """A model-independent text form of a conversation (for planning keys and size estimates)."""
    return "\n".join(f"{m['role']}: {m['content']}" for m in messages)
