"""Which constraint a job's rows are generated under, checked before any model is loaded.

- a task's own: ``task: extract``'s JSON schema, ``label.mode: constrained``'s label set
  (``Task.own_constraint``);
- otherwise ``sampling.structured`` when given: ``{regex: ...}``, ``{choice: [...]}``, ``{grammar: ...}``
  (EBNF), ``{json_schema: ...}`` or ``{json_object: true}``, plus ``any_whitespace``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from prefixflow.pipeline import engine_access
from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig

if TYPE_CHECKING:  # tasks call in here to check and build their constraints
    from prefixflow.pipeline.tasks.base import Task


def check_structured(so: Any, path: str = "sampling.structured") -> None:
    """Compile the constraint without a model (grammar engine only): a bad regex, grammar or schema, or
    a missing grammar engine, fails the job here with exit 2 instead of every row later."""
    problem = engine_access.structured_outputs_error(so)
    if problem:
        raise JobConfigError(f"job config: {path}: {problem}")


def job_constraint(cfg: JobConfig, task: Task) -> Any:
    """The ``StructuredOutputs`` every row of the job is generated under, or None."""
    own = task.own_constraint(cfg)
    if own is not None:
        return own[1]
    return cfg.sampling.structured.outputs() if cfg.sampling.structured is not None else None


def check_job_constraint(cfg: JobConfig, task: Task) -> None:
    """``sampling.structured`` compiles and does not compete with the task's own constraint (an extract
    job's schema, a constrained label job's labels); what any constraint rules out (ignore_eos,
    min_tokens) is named."""
    given = cfg.sampling.structured
    own = task.own_constraint(cfg)
    if given is not None and own is not None:
        raise JobConfigError(
            f"job config: sampling.structured: a {cfg.task} job is already constrained to {own[0]}; remove it"
        )
    if given is None and own is None:
        return
    for name in ("ignore_eos", "min_tokens"):
        if getattr(cfg.sampling, name):
            raise JobConfigError(
                f"job config: sampling.{name}: cannot be combined with a constrained output: "
                "the grammar decides where the output ends"
            )
    if given is not None:
        check_structured(given.outputs())
