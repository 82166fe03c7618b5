"""The Task registry: a task added as docs/architecture.md shows it (one module, one registry line) runs
end to end, and the built-in tasks are all behind the one interface."""

from __future__ import annotations

import re
import types
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from prefixflow.pipeline import JobConfigError, load_job
from prefixflow.pipeline.run.local_run import run_local
from prefixflow.pipeline.tasks import registry
from prefixflow.pipeline.tasks.base import Task
from tests.pipeline.support import job, write_dataset

REPO = Path(__file__).resolve().parents[3]


def _documented_task() -> type[Task]:
    """The worked example of docs/architecture.md ("Adding a task"), as written there."""
    text = (REPO / "docs" / "architecture.md").read_text()
    section = text[text.index("### Adding a task") :]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code is not None
    module = types.ModuleType("keywords_task")
    exec(compile(code.group(1), "docs/architecture.md", "exec"), module.__dict__)  # noqa: S102
    return module.KeywordsTask  # type: ignore[no-any-return]


def test_the_documented_task_runs_end_to_end(
    tmp_path: Path, tiny_llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(registry.TASKS, "keywords", _documented_task()())  # the registry line
    write_dataset(tmp_path / "in", files=1, rows_per_file=4)
    cfg = job("keywords", template="Keywords for: {{ text }}", sampling={"max_tokens": 6})
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert failures == [] and summary.rows == 4
    schema = pq.read_schema(next((tmp_path / "out" / "data").rglob("*.parquet")))
    assert str(schema.field("keywords").type) == "list<element: string>"
    df = pl.read_parquet(summary.data_glob)
    for output, keywords in zip(df["output"], df["keywords"]):
        assert list(keywords) == [w.strip() for w in output.split(",") if w.strip()]
    with pytest.raises(JobConfigError, match="prompt_column"):
        load_job("in/", "out/", "tiny", {"task": "keywords"})
    with pytest.raises(JobConfigError, match=r"keep_columns.*\['keywords'\].*overwrite"):
        load_job("in/", "out/", "tiny", {"task": "keywords", "template": "x", "keep_columns": ["keywords"]})


def test_unknown_task_lists_the_registered_ones(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(
        JobConfigError, match="allowed values: generate, summarize, label, extract, openai_batch$"
    ):
        load_job("in/", "out/", "tiny", {"task": "keywords"})
    monkeypatch.setitem(registry.TASKS, "keywords", _documented_task()())
    assert load_job("in/", "out/", "tiny", {"task": "keywords", "prompt_column": "p"}).task.name == "keywords"
