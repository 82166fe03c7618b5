"""The Task interface: everything the pipeline asks of a kind of job.

A task validates its part of the job, renders a row into what the engine gets, names its output
columns and their Arrow types, turns engine outputs into row values, watches rows as they finish, and
finishes a run (label counts, the collapse warning). The defaults are plain generation, so a task
overrides only what it does differently. See docs/architecture.md, "Adding a task".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from prefixflow.pipeline.config import JobConfig
from prefixflow.pipeline.errors import JobConfigError


class Task:
    """One ``task:`` value. Instances are stateless: per-job state lives in the JobConfig."""

    name: ClassVar[str] = ""
    several_samples: ClassVar[bool] = False  # sampling.n > 1 (one row, several outputs) makes sense
    takes_schema: ClassVar[bool] = False  # the job's ``schema:`` is this task's

    # -- validation (once, at load) -----------------------------------------------------------------
    def check(self, cfg: JobConfig, given: Mapping[str, Any]) -> JobConfig:
        """Validate the task's part of ``cfg`` (``given``: the job as written) with the features it
        uses; returns ``cfg`` completed with the task's defaults. Raises JobConfigError."""
        return cfg

    def own_constraint(self, cfg: JobConfig) -> tuple[str, Any] | None:
        """(what it is, the ``StructuredOutputs``) when the task itself constrains every row's output."""
        return None

    # -- prompts --------------------------------------------------------------------------------------
    def template(self, cfg: JobConfig) -> str | None:
        """The prompt template rows are rendered with (None: a column is the prompt)."""
        return cfg.template

    def prompt_columns(self, cfg: JobConfig) -> set[str]:
        """Input columns the task's prompts read beyond the prompt column and the template's."""
        return set()

    def input_columns(self, cfg: JobConfig) -> tuple[str, ...]:
        """Other input columns the task reads for each row (a label job's gold labels)."""
        return ()

    def named_columns(self, cfg: JobConfig) -> dict[str, str]:
        """Input columns the task's own settings name, each with its key (a typo there is refused at plan)."""
        return {}

    def document_column(self, cfg: JobConfig) -> str | None:
        """The column a long-document policy may shorten (None: prompts too long are error rows)."""
        return None


def require_prompt(cfg: JobConfig) -> None:
    """A task whose rows have no natural default prompt column."""
    if not (cfg.prompt_column or cfg.template or cfg.messages_column):
        raise JobConfigError(f"job config: prompt_column: a {cfg.task} job needs prompt_column (a column) or "
                             "template (Jinja2)")  # fmt: skip
