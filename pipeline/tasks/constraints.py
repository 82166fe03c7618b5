"""Which constraint a job's rows are generated under, checked before any model is loaded.

- ``task: extract``: the job's JSON schema (``schema:``).
- ``task: label`` with ``label.mode: constrained``: exactly one of the labels.
- otherwise ``sampling.structured`` when given: ``{regex: ...}``, ``{choice: [...]}``, ``{grammar: ...}``
  (EBNF), ``{json_schema: ...}`` or ``{json_object: true}``, plus ``any_whitespace``.
"""

from __future__ import annotations

import difflib
from dataclasses import fields
from typing import TYPE_CHECKING, Any

from prefixflow.pipeline.errors import JobConfigError

if TYPE_CHECKING:
    from prefixflow.pipeline.job.config import JobConfig

STRUCTURED_KEYS = ("json_schema", "regex", "choice", "grammar", "json_object", "any_whitespace")


def structured_from_mapping(value: Any, path: str = "sampling.structured") -> Any:
    """``sampling.structured`` as a ``StructuredOutputs``; JobConfigError naming the key when malformed."""
    from prefixflow.pipeline.engine_access import StructuredOutputs

    if not isinstance(value, dict):
        raise JobConfigError(
            f"job config: {path}: expected a mapping such as {{regex: '...'}}, got {value!r}"
        )
    allowed = tuple(f.name for f in fields(StructuredOutputs))
    for key in value:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise JobConfigError(
                f"job config: {path}.{key}: unknown key{hint}; allowed keys: {', '.join(allowed)}"
            )
    values = dict(value)
    if isinstance(values.get("choice"), list):
        values["choice"] = tuple(values["choice"])
    return StructuredOutputs(**values)


def check_structured(so: Any, path: str = "sampling.structured") -> None:
    """Compile the constraint without a model (grammar engine only): a bad regex, grammar or schema, or
    a missing grammar engine, fails the job here with exit 2 instead of every row later."""
    from prefixflow.pipeline.engine_access import structured_outputs_error

    problem = structured_outputs_error(so)
    if problem:
        raise JobConfigError(f"job config: {path}: {problem}")


def job_constraint(task: str, schema: dict[str, Any] | None, labels: tuple[str, ...], label_mode: str,
                   sampling: dict[str, Any]) -> Any:  # fmt: skip
    """The ``StructuredOutputs`` every row of the job is generated under, or None."""
    from prefixflow.pipeline.engine_access import StructuredOutputs

    if task == "extract" and schema is not None:
        return StructuredOutputs(json_schema=schema)
    if task == "label" and label_mode == "constrained":
        return StructuredOutputs(choice=tuple(labels))
    if sampling.get("structured") is not None:
        return structured_from_mapping(sampling["structured"])
    return None


def parse_schema(value: Any, task: str) -> dict[str, Any] | None:
    """``schema:`` (extract jobs only): loaded and checked here, so a bad schema exits 2 before any work."""
    if value is None:
        if task == "extract":
            raise JobConfigError("job config: schema: an extract job needs a JSON schema (inline, or a "
                                 ".json/.yaml file path)")  # fmt: skip
        return None
    if task != "extract":
        raise JobConfigError(f"job config: schema: applies to extract jobs only (this job is task: {task})")
    from prefixflow.pipeline.tasks.extract import check_schema, load_schema

    schema = load_schema(value)
    check_schema(schema)
    return schema


def check_job_constraint(cfg: JobConfig) -> None:
    """``sampling.structured`` compiles and does not compete with the constraint of an extract or
    ``label.mode: constrained`` job; what any constraint rules out (ignore_eos, min_tokens) is named."""
    given = cfg.sampling.get("structured")
    own = cfg.task == "extract" or (cfg.task == "label" and cfg.label.mode == "constrained")
    if given is not None and own:
        what = "its schema" if cfg.task == "extract" else "the label set"
        raise JobConfigError(f"job config: sampling.structured: a {cfg.task} job is already constrained to "
                             f"{what}; remove it")  # fmt: skip
    so = job_constraint(cfg.task, cfg.schema, cfg.label.labels, cfg.label.mode, cfg.sampling)
    if so is None:
        return
    for name in ("ignore_eos", "min_tokens"):
        if cfg.sampling.get(name):
            raise JobConfigError(f"job config: sampling.{name}: cannot be combined with a constrained output: "
                                 "the grammar decides where the output ends")  # fmt: skip
    if given is not None:
        check_structured(so)
