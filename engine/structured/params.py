"""What a constrained request asks for: one of a JSON schema, a regex, a choice, an EBNF grammar or any
JSON object. Checked without the grammar engine, so a malformed request is an error output, not a crash."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Any

KINDS = ("json_schema", "regex", "choice", "grammar", "json_object")


@dataclass(frozen=True)
class StructuredOutputs:
    """Constrain generation to a language; exactly one field is set (names follow vLLM's guided decoding).

    - ``json_schema``: a JSON schema (dict or JSON text); the output is one JSON value that satisfies it.
    - ``regex``: the whole output matches this regular expression.
    - ``choice``: the output is exactly one of these strings.
    - ``grammar``: an EBNF grammar (GBNF dialect, start rule ``root``), e.g. ``root ::= "yes" | "no"``.
    - ``json_object=True``: any JSON object.

    ``any_whitespace=False`` (the default) writes JSON with ``", "`` and ``": "`` separators and no other
    whitespace: small models otherwise tend to emit runs of newlines inside an object until max_tokens.
    The end-of-sequence token is allowed exactly when the output is complete.
    """

    json_schema: dict[str, Any] | str | None = None
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None
    json_object: bool = False
    any_whitespace: bool = False

    @property
    def kind(self) -> str:
        for name in KINDS:
            value = getattr(self, name)
            if value is not None and value is not False:
                return name
        return ""

    def schema(self) -> dict[str, Any]:
        """The JSON schema as a dict (parsed when given as text)."""
        value = self.json_schema
        return json.loads(value) if isinstance(value, str) else dict(value or {})

    @cached_property
    def cache_key(self) -> tuple[str, str, bool]:
        """Identity for the compiled-grammar cache (computed once per object: a job passes one object for
        every row); the schema's key order is kept, since it orders the output's keys."""
        kind = self.kind
        if kind == "json_schema":
            text = self.json_schema if isinstance(self.json_schema, str) else json.dumps(self.json_schema)
        elif kind == "choice":
            text = json.dumps(list(self.choice or ()))
        elif kind == "json_object":
            text = ""
        else:
            text = str(getattr(self, kind))
        return kind, text, self.any_whitespace

    def validation_error(self) -> str | None:
        """A message naming what is malformed, or None. Whether a schema/regex/grammar compiles is
        checked by the grammar engine (``structured_outputs_error``)."""
        chosen = [
            name for name in KINDS if getattr(self, name) is not None and getattr(self, name) is not False
        ]
        if len(chosen) != 1:
            got = ", ".join(chosen) if chosen else "none"
            return f"set exactly one of {', '.join(KINDS)} (got {got})"
        kind = chosen[0]
        value = getattr(self, kind)
        if not isinstance(self.any_whitespace, bool):
            return f"any_whitespace must be true or false, got {self.any_whitespace!r}"
        if kind == "json_schema":
            return _schema_error(value)
        if kind in ("regex", "grammar") and (not isinstance(value, str) or not value):
            return f"{kind} must be a non-empty string, got {value!r}"
        if kind == "choice":
            if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
                return f"choice must be a non-empty list of strings, got {value!r}"
            if not all(isinstance(c, str) and c for c in value):
                return f"choice entries must be non-empty strings, got {list(value)!r}"
            if len(set(value)) != len(value):
                return f"choice entries must be unique, got {list(value)!r}"
        if kind == "json_object" and value is not True:
            return f"json_object must be true or false, got {value!r}"
        return None


def _schema_error(value: object) -> str | None:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            return f"json_schema is not valid JSON: {exc}"
    if not isinstance(value, dict):
        return f"json_schema must be a JSON object (a mapping), got {type(value).__name__}"
    return None
