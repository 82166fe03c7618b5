"""The tasks a job's ``task:`` may name. Adding a task: one module beside this one, one line here."""

from __future__ import annotations

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.tasks.base import Task
from prefixflow.pipeline.tasks.extract_task import ExtractTask
from prefixflow.pipeline.tasks.generate import GenerateTask
from prefixflow.pipeline.tasks.label.task import LabelTask
from prefixflow.pipeline.tasks.openai_batch_task import OpenAIBatchTask
from prefixflow.pipeline.tasks.summarize import SummarizeTask

TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        GenerateTask(),
        SummarizeTask(),
        LabelTask(),
        ExtractTask(),
        OpenAIBatchTask(),
    )
}


def get_task(name: str) -> Task:
    """The registered task called ``name``; JobConfigError listing them otherwise."""
    task = TASKS.get(name)
    if task is None:
        raise JobConfigError(f"job config: task: {name!r} is not allowed; allowed values: {', '.join(TASKS)}")
    return task


def task_of(cfg: JobConfig) -> Task:
    return get_task(cfg.task)
