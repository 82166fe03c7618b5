"""``task: extract``: the job's JSON schema, checked before any work, and each output checked against it.

The engine constrains generation to the schema, so an output fails only when generation stopped early
(``max_tokens`` in the middle of an object: class ``truncated_json``) or the schema says more than the
grammar engine enforces (class ``schema``); such a row becomes an error row with the raw text kept.
"""

from __future__ import annotations

import copy
import json
import os
from typing import Any

import yaml

from prefixflow.pipeline.errors import SCHEMA_ERROR, TRUNCATED_JSON, JobConfigError
from prefixflow.pipeline.tasks.json_columns import Shape, shape_of, to_arrow

SCHEMA_FILE_SUFFIXES = (".json", ".yaml", ".yml")


def load_schema(value: Any, base_dir: str | None = None) -> dict[str, Any]:
    """``schema:`` as given in a job: a mapping, JSON text, or a path to a .json/.yaml file (relative
    paths from the job file's folder, else the working directory). The content is kept, not the path,
    so the job fingerprint changes when the schema does."""
    if isinstance(value, dict):
        return copy.deepcopy(value)
    if not isinstance(value, str) or not value.strip():
        raise JobConfigError(
            f"job config: schema: expected a JSON schema (a mapping, JSON text or a file path), got {value!r}"
        )
    text = value.strip()
    if text.startswith("{"):
        return _parse(text, "schema", json_only=True)
    path = os.path.expanduser(text)
    if not os.path.isabs(path) and base_dir:
        path = os.path.join(base_dir, path)
    if not os.path.isfile(path):
        raise JobConfigError(
            f"job config: schema: file {path!r} not found (give a JSON schema inline or a "
            f"{'/'.join(SCHEMA_FILE_SUFFIXES)} file path)"
        )
    with open(path, encoding="utf-8") as f:
        return _parse(f.read(), f"schema file {path!r}", json_only=path.endswith(".json"))


def schema_beside(value: str, job_dir: str) -> str:
    """A relative schema path as seen from the job file's folder, when a file is there (else unchanged)."""
    text = value.strip()
    if text.startswith("{") or os.path.isabs(os.path.expanduser(text)):
        return value
    candidate = os.path.join(job_dir, text)
    return candidate if os.path.isfile(candidate) else value


def _parse(text: str, where: str, json_only: bool) -> dict[str, Any]:
    try:
        data = json.loads(text) if json_only else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise JobConfigError(
            f"job config: {where} is not valid {'JSON' if json_only else 'YAML'}: {exc}"
        ) from exc
    if not isinstance(data, dict):
        raise JobConfigError(f"job config: {where}: a JSON schema is a mapping, got {type(data).__name__}")
    return data


def check_schema(schema: dict[str, Any]) -> None:
    """Raise JobConfigError naming the problem: not a valid JSON schema, or one the grammar engine cannot
    compile (unsupported keyword, bad ``pattern`` regex, min > max). Needs no model."""
    from jsonschema import exceptions, validators

    cls = validators.validator_for(schema)
    try:
        cls.check_schema(schema)
    except exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        raise JobConfigError(f"job config: schema: invalid JSON schema at {where}: {exc.message}") from exc
    from prefixflow.pipeline.engine_access import StructuredOutputs, structured_outputs_error

    problem = structured_outputs_error(StructuredOutputs(json_schema=schema))
    if problem:
        raise JobConfigError(f"job config: schema: {problem}")


class Extraction:
    """Per job: the schema's validator and storage shape, applied to each finished output."""

    def __init__(self, schema: dict[str, Any]) -> None:
        from jsonschema import validators

        self.schema = schema
        self.validator = validators.validator_for(schema)(schema)
        self.shape: Shape = shape_of(schema)

    def parse(self, text: str, finish_reason: str) -> tuple[Any, str | None, str | None]:
        """``(value for the typed column, None, None)`` or ``(None, error class, why)``: the class is
        ``truncated_json`` when ``max_tokens`` ended the output before the JSON was complete (raise
        max_tokens or bound the schema), else ``schema``."""
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            if finish_reason == "length":
                return (
                    None,
                    TRUNCATED_JSON,
                    f"output is not complete JSON: max_tokens was reached in the middle of it ({exc.msg})",
                )
            return None, SCHEMA_ERROR, f"output is not valid JSON ({exc.msg} at character {exc.pos})"
        errors = sorted(self.validator.iter_errors(value), key=lambda e: list(e.absolute_path))
        if errors:
            first = errors[0]
            return (
                None,
                SCHEMA_ERROR,
                f"output does not match the schema at {first.json_path}: {first.message}",
            )
        try:
            return to_arrow(value, self.shape), None, None
        except ValueError as exc:
            return None, SCHEMA_ERROR, f"output cannot be stored in the schema's columns: {exc}"
