"""``task: extract``: generation constrained to the job's JSON schema; each output is checked against
it and stored typed in the ``extracted`` column (pipeline/tasks/extract.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from prefixflow.pipeline import engine_access
from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.tasks.base import OutputParser, Task, require_prompt
from prefixflow.pipeline.tasks.extract import Extraction, check_schema, load_schema
from prefixflow.pipeline.tasks.json_columns import shape_of


def job_schema(cfg: JobConfig) -> dict[str, Any]:
    """The loaded schema of a checked extract job."""
    if not isinstance(cfg.json_schema, dict):
        raise JobConfigError(
            "job config: schema: an extract job needs a JSON schema (inline, or a .json/.yaml file path)"
        )
    return cfg.json_schema


class ExtractTask(Task):
    name = "extract"
    takes_schema = True

    def check(self, cfg: JobConfig, given: Mapping[str, Any]) -> JobConfig:
        if cfg.json_schema is None:
            job_schema(cfg)  # names what is missing
        schema = load_schema(cfg.json_schema)
        check_schema(schema)  # so a bad schema exits 2 before any work
        require_prompt(cfg)
        return cfg.replaced(json_schema=schema)

    def own_constraint(self, cfg: JobConfig) -> tuple[str, Any] | None:
        return "its schema", engine_access.StructuredOutputs(json_schema=job_schema(cfg))

    def output_fields(self, cfg: JobConfig) -> list[pa.Field]:
        return [pa.field("extracted", shape_of(job_schema(cfg)).type)]  # typed; `output` keeps the JSON text

    def output_parser(self, cfg: JobConfig) -> OutputParser | None:
        extraction = Extraction(job_schema(cfg))

        def parse(rec: dict[str, Any], text: str, finish_reason: str) -> dict[str, Any]:
            value, error_class, problem = extraction.parse(text, finish_reason)
            if error_class is not None:
                return {**rec, "finish_reason": "error", "error_class": error_class, "error": problem}
            return {**rec, "extracted": value}

        return parse
