"""``task: generate``: the row's prompt in, the model's text out (``sampling.n`` samples per row)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.tasks.base import Task


class GenerateTask(Task):
    name = "generate"
    several_samples = True

    def check(self, cfg: JobConfig, given: Mapping[str, Any]) -> JobConfig:
        if not (cfg.prompt_column or cfg.template or cfg.messages_column):
            return cfg.replaced(prompt_column="prompt")
        return cfg
