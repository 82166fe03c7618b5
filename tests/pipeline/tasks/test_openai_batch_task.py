"""OpenAI Batch lines are a registered Task (``openai_batch``): the Batch driver's job runs under it, it
holds a job to the requests table's prompt side, and registering it changed no other task's fingerprint
(tests/pipeline/job/test_job_model.py pins those) and a Batch job's only in the task's name."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from prefixflow.pipeline import JobConfigError, load_job
from prefixflow.pipeline.errors import InputError
from prefixflow.pipeline.run.batch_run import prepare_batch
from prefixflow.pipeline.tasks.openai_batch import batch_job
from prefixflow.pipeline.tasks.openai_batch_task import OpenAIBatchTask
from prefixflow.pipeline.tasks.registry import TASKS

GOLDEN = json.loads((Path(__file__).parents[1] / "job" / "data" / "fingerprint_v2_jobs.json").read_text())


def _fingerprint_job(spec: Any) -> dict[str, Any]:
    return dict(json.loads(json.dumps(spec.fingerprint(), default=str))["job"])


def test_the_batch_driver_runs_its_requests_under_the_registered_task(tmp_path: Path) -> None:
    batch = tmp_path / "batch.jsonl"
    line = {
        "custom_id": "a",
        "url": "/v1/chat/completions",
        "body": {"messages": [{"role": "user", "content": "hi"}]},
    }
    batch.write_text(json.dumps(line) + "\n")
    job = prepare_batch(str(batch), str(tmp_path / "results.jsonl"), "tiny")
    assert isinstance(TASKS["openai_batch"], OpenAIBatchTask) and job.spec.task is TASKS["openai_batch"]
    assert job.spec.config.task == "openai_batch" and job.spec.config.id_column == "custom_id"


def test_a_batch_jobs_fingerprint_differs_from_before_the_task_only_in_its_name() -> None:
    before = GOLDEN["batch"]  # the Batch job as it ran under task: generate
    written = {
        k: v for k, v in before["job"].items() if k not in ("task", "sampling_columns", "keep_columns")
    }
    spec = load_job("in/", "out/", "tiny", batch_job(written))
    assert _fingerprint_job(spec) == {**before["fingerprint_job"], "task": "openai_batch"}


def test_the_task_fills_the_prompt_side_and_refuses_a_job_that_changes_it() -> None:
    spec = load_job("in/", "out/", "tiny", {"task": "openai_batch", "sampling": {"max_tokens": 4}})
    cfg = spec.config
    assert (cfg.id_column, cfg.messages_column, cfg.prompt_column, cfg.chat) == (
        "custom_id",
        "messages",
        "prompt",
        "off",
    )
    assert cfg.keep_columns == ("request_kind",) and cfg.sampling_columns["n"] == "n"
    assert _fingerprint_job(spec) == _fingerprint_job(
        load_job("in/", "out/", "tiny", batch_job({"sampling": {"max_tokens": 4}}))
    )
    with pytest.raises(JobConfigError, match="template: an openai_batch job takes its prompts"):
        load_job("in/", "out/", "tiny", {"task": "openai_batch", "template": "{{ x }}"})
    with pytest.raises(JobConfigError, match="id_column"):
        load_job("in/", "out/", "tiny", {"task": "openai_batch", "id_column": "row"})
    # a job written for a Batch file may still say task: generate (what Batch jobs ran as), nothing else
    assert load_job("in/", "out/", "tiny", batch_job({"task": "generate"})).config.task == "openai_batch"
    with pytest.raises(InputError, match="sets its own task"):
        batch_job({"task": "summarize"})
