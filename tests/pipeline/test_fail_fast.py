"""Failing early and clearly (issue 10, item 8): bad model folders and engine settings before anything is
written, an unreachable S3 endpoint in one line, max_tokens over the context, concurrent cleanup."""

from __future__ import annotations

import io
import json
import socket
import threading
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefixflow.pipeline import load_job, prepare_output
from prefixflow.pipeline.cli import main
from prefixflow.pipeline.local_run import run_local
from prefixflow.pipeline.run import commit as commits
from prefixflow.pipeline.run.record import output_layout
from tests.pipeline.support import job, write_dataset


def _run(tmp_path: Path, *extra: str, model: str = "tiny", out: str | None = None) -> int:
    return main(
        [
            "run",
            "--input",
            str(tmp_path / "in"),
            "--output",
            out or str(tmp_path / "out"),
            "--model",
            model,
            "--prompt-column",
            "text",
            "--max-tokens",
            "2",
            "--no-progress",
            *extra,
        ]
    )


def test_pytorch_bin_only_model_folder_exits_2_before_anything_is_written(tmp_path: Path, capsys) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"model_type": "llama"}))
    (model / "pytorch_model.bin").write_bytes(b"pickled weights")
    assert _run(tmp_path, model=str(model)) == 2
    err = capsys.readouterr().err
    assert "pytorch_model.bin" in err and "safetensors" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_kv_budget_too_small_exits_2_before_the_run_record(tmp_path: Path, capsys) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    assert _run(tmp_path, "--engine", "kv_cache_memory_bytes=10") == 2
    err = capsys.readouterr().err
    assert "KV cache budget of 10 bytes" in err and "kv_cache_memory_bytes" in err
    assert not (tmp_path / "out").exists()


def test_max_tokens_over_the_context_is_named_not_a_negative_limit(tmp_path: Path, tiny_llm, capsys) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    assert _run(tmp_path, "--max-tokens", str(10**9)) == 2  # the job's own value: fail fast
    err = capsys.readouterr().err
    assert "max_tokens is 1000000000" in err and "(max_model_len) is 2048" in err and "-99999" not in err
    assert not (tmp_path / "out").exists()
    rows = [{"id": f"r{i}", "text": "apple river", "mt": 10**9 if i == 1 else 3} for i in range(3)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "in" / "part-0.parquet")  # per row: an error row
    spec = load_job(
        str(tmp_path / "in"),
        str(tmp_path / "out"),
        "tiny",
        job("generate", prompt_column="text", template=None, sampling_columns={"max_tokens": "mt"}),
    )
    summary, _ = run_local(spec, llm=tiny_llm, progress=False)
    table = pq.read_table(str(tmp_path / "out" / "data")).to_pylist()
    bad = [r for r in table if r["id"] == "r1"][0]
    assert summary.rows == 3 and summary.errors_by_class == {"bad_sampling": 1}
    assert "max_tokens is 1000000000" in bad["error"] and "is 160" in bad["error"]


def test_a_job_sampling_value_outside_the_vocabulary_exits_2_before_the_run_record(
    tmp_path: Path, capsys
) -> None:
    """Values only the model can judge (stop ids past its vocabulary) used to reach the engine and make
    every row an engine_error row; they fail fast like max_tokens over the context."""
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    spec = job(
        "generate", prompt_column="text", template=None, sampling={"stop_token_ids": [10**6], "min_tokens": 1}
    )
    (tmp_path / "job.yaml").write_text(json.dumps(spec))
    assert _run(tmp_path, "--job", str(tmp_path / "job.yaml")) == 2
    err = capsys.readouterr().err
    assert "stop_token_ids holds 1000000, outside the vocabulary [0, 512)" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_rows_are_checked_against_the_vocabulary_too(tiny_llm) -> None:
    from prefixflow.pipeline.errors import RowError
    from prefixflow.pipeline.job.spec import parse_job_config
    from prefixflow.pipeline.tasks.registry import task_of
    from prefixflow.pipeline.tasks.rows import RowPreparer

    cfg = parse_job_config(
        job("generate", prompt_column="text", template=None, sampling={"stop_token_ids": [10**6]})
    )
    with pytest.raises(RowError, match="outside the vocabulary") as caught:
        RowPreparer(cfg, tiny_llm, {}, task_of(cfg)).params({"text": "x"})
    assert caught.value.error_class == "bad_sampling"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_s3_endpoint_is_one_line_and_exit_1_with_the_resume_hint(
    tmp_path: Path, capsys, monkeypatch
) -> None:
    """Exit 1, not 2 (issue 22 item 11): an endpoint that is away may come back; the same command resumes."""
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "y")
    endpoint = f"http://127.0.0.1:{_closed_port()}"
    fast = "config_kwargs={retries: {max_attempts: 1}}"
    assert _run(tmp_path, "--endpoint-url", endpoint, "--storage-option", fast, out="s3://bucket/out") == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert "cannot be reached" in err and endpoint in err and "--endpoint-url" in err
    assert "run the same command again to resume" in " ".join(err.split())


def test_staging_cleanup_while_another_attempt_writes_there(tmp_path: Path) -> None:
    """Two runs of one job on the same shard: the committer's cleanup of staging used to fail with
    ENOTEMPTY (and the other attempt's next flush with FileNotFoundError)."""
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate"))
    layout = output_layout(spec).for_run(prepare_output(spec).run_id)
    buf = io.BytesIO()
    pq.write_table(
        pa.table(
            {
                "source_file": ["a.parquet"],  # staged parts key rows by (file, row) since packed shards
                "row_index": [0],
                "error_class": pa.array([None], pa.string()),
                "prompt_tokens": [1],
                "cached_tokens": [0],
                "output_tokens": [1],
            }
        ),
        buf,
    )
    data = buf.getvalue()
    errors: Counter[str] = Counter()
    shard, stop = ["s0"], threading.Event()

    def other_attempt() -> None:
        n = 0
        while not stop.is_set():
            try:
                commits.write_part(layout, shard[0], "other", n, data)
            except Exception as exc:  # noqa: BLE001 - counted and asserted below
                errors[f"writer {type(exc).__name__}"] += 1
            n += 1

    thread = threading.Thread(target=other_attempt)
    thread.start()
    try:
        for i in range(40):
            shard[0] = f"s{i}"
            parts = [commits.write_part(layout, f"s{i}", "mine", 0, data)]
            try:
                commits.commit(layout, commits.build_marker(layout, f"s{i}", "fp", "mine", parts, 0.1, 1))
            except Exception as exc:  # noqa: BLE001
                errors[f"commit {type(exc).__name__}"] += 1
    finally:
        stop.set()
        thread.join()
    assert not errors, dict(errors)
    assert len(commits.list_markers(layout)) == 40


@pytest.mark.parametrize("case", ["loops", "size", "multiply"])
def test_a_runaway_template_becomes_an_error_row(tmp_path: Path, tiny_llm, case: str) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    heavy = {
        "loops": "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}",
        "size": "{% for i in range(99999) %}{{ text }}{% endfor %}",
        "multiply": "{{ text * 10**9 }}",
    }[case]
    template = "{% if id == 'doc-0001' %}" + heavy + "{% endif %}Write about {{ text }}"
    cfg = job("generate", template=template, template_limits={"seconds": 0.5, "max_chars": 100_000})
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    rows = {r["id"]: r for r in pq.read_table(str(tmp_path / "out" / "data")).to_pylist()}
    assert summary.complete and not failures and summary.errors_by_class == {"template_limit": 1}
    assert (
        rows["doc-0001"]["error_class"] == "template_limit"
        and "template_limits." in rows["doc-0001"]["error"]
    )
    assert rows["doc-0000"]["error"] is None and rows["doc-0002"]["error"] is None
