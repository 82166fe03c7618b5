"""``task: label``: one of the job's labels per row, by scoring each label (``score``, calibrated),
parsing free text (``generate``) or generating under a constraint (``constrained``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefixflow.pipeline import engine_access
from prefixflow.pipeline.config import JobConfig
from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.label_references import check_references
from prefixflow.pipeline.label_scoring import check_distinct_forms
from prefixflow.pipeline.tasks.base import Task, require_prompt


def constrained_choices(cfg: JobConfig) -> tuple[str, ...]:
    """``label.mode: constrained`` generates exactly one of these (the labels after ``choice_prefix``)."""
    return tuple(cfg.label.choice_prefix + lb for lb in cfg.label.labels)


class LabelTask(Task):
    name = "label"

    def check(self, cfg: JobConfig, given: Mapping[str, Any]) -> JobConfig:
        label = cfg.label
        if len(label.labels) < 2:
            raise JobConfigError("job config: label.labels: a label job needs at least two labels, e.g. "
                                 "[positive, negative]")  # fmt: skip
        if len(set(label.labels)) != len(label.labels):
            raise JobConfigError(f"job config: label.labels: labels must be unique, got {list(label.labels)}")
        if label.mode == "score":
            check_distinct_forms(label.labels, label.case_variants)
        require_prompt(cfg)
        if cfg.summarize.long_document == "map_reduce" and "summarize" in given:
            raise JobConfigError("job config: summarize.long_document: map_reduce applies to summarize jobs only")
        if label.mode == "score":
            check_references(cfg, self.template(cfg))
        return cfg

    def input_columns(self, cfg: JobConfig) -> tuple[str, ...]:
        return (cfg.label.gold_column,) if cfg.label.gold_column else ()

    def named_columns(self, cfg: JobConfig) -> dict[str, str]:
        return {cfg.label.gold_column: "label.gold_column"} if cfg.label.gold_column else {}

    def own_constraint(self, cfg: JobConfig) -> tuple[str, Any] | None:
        if cfg.label.mode != "constrained":
            return None
        return "the label set", engine_access.StructuredOutputs(choice=constrained_choices(cfg))
