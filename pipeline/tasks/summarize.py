"""``task: summarize``: a document column in, its summary out; documents longer than the context are
an error row, truncated (head, tail or both) or summarized in chunks and reduced (``map_reduce``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig, SummarizeConfig
from prefixflow.pipeline.prompts.render import template_columns
from prefixflow.pipeline.prompts.sandbox import check_template
from prefixflow.pipeline.tasks.base import Task

DEFAULT_SUMMARY_TEMPLATE = "Summarize the following text in one or two sentences.\n\n{{ document }}"


class SummarizeTask(Task):
    name = "summarize"

    def check(self, cfg: JobConfig, given: Mapping[str, Any]) -> JobConfig:
        if cfg.messages_column:
            raise JobConfigError(
                "job config: messages_column: applies to generate and label jobs; summarize "
                "reads a document column"
            )
        check_template(cfg.summarize.reduce_template, "summarize.reduce_template")
        return cfg

    def template(self, cfg: JobConfig) -> str | None:
        if cfg.template is None and cfg.prompt_column is None:
            return DEFAULT_SUMMARY_TEMPLATE
        return cfg.template

    def prompt_columns(self, cfg: JobConfig) -> set[str]:
        columns = template_columns(cfg.summarize.reduce_template) if cfg.summarize.reduce_template else set()
        return columns | ({cfg.summarize.document_column} if cfg.summarize.document_column else set())

    def named_columns(self, cfg: JobConfig) -> dict[str, str]:
        column = cfg.summarize.document_column
        return {column: "summarize.document_column"} if column and not cfg.prompt_column else {}

    def document_column(self, cfg: JobConfig) -> str | None:
        return cfg.prompt_column or cfg.summarize.document_column

    def long_documents(self, cfg: JobConfig) -> SummarizeConfig | None:
        return cfg.summarize
