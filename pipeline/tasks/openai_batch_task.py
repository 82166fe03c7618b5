"""``task: openai_batch``: the lines of an OpenAI Batch JSONL file, run as rows of its requests table.

openai_batch.py converts the file into that table (one row per line: its messages or prompt, its sampling
values, or why it cannot run); run/batch_run.py runs it as an ordinary, resumable run and writes the results
file from the committed rows (openai_batch_output.py). This task holds the job to the table's prompt side
(BATCH_FIELDS: the file, not the job, says what each line asks) and generates like ``generate``, several
samples per line where its body asks for ``n``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.tasks.base import Task
from prefixflow.pipeline.tasks.openai_batch import BATCH_FIELDS


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


class OpenAIBatchTask(Task):
    name = "openai_batch"
    several_samples = True  # a line's body.n

    def check(self, cfg: JobConfig, given: Mapping[str, Any]) -> JobConfig:
        """The prompt side is the requests table's: filled in where the job leaves it out, refused where
        the job says otherwise."""
        fixed = {k: v for k, v in BATCH_FIELDS.items() if k != "task"}
        wrong = sorted(k for k in fixed if k in given and _plain(getattr(cfg, k)) != fixed[k])
        if wrong:
            raise JobConfigError(
                f"job config: {wrong[0]}: an openai_batch job takes its prompts and sampling from the "
                f"Batch file's lines; leave {', '.join(wrong)} out of the job config"
            )
        missing = {k: v for k, v in fixed.items() if k not in given}
        if not missing:
            return cfg
        return cfg.replaced(**{k: tuple(v) if isinstance(v, list) else v for k, v in missing.items()})
