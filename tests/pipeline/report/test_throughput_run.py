"""A run records its throughput over time beside the run record; status shows it, finalize draws it, and
the run summary carries the usage (tokens and device-seconds)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

from prefixflow.pipeline import load_job
from prefixflow.pipeline.cli import main
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import job, write_dataset


def test_a_run_records_and_shows_throughput_and_usage(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=2, rows_per_file=6)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate"))
    summary, failures = run_local(spec, llm=tiny_llm, progress=False)
    assert not failures and summary.device_seconds > 0
    (series_file,) = (tmp_path / "out" / "_metrics").glob("*/throughput/local-*.json")  # _metrics/<run id>/
    series = json.loads(series_file.read_text())
    assert sum(row[2] for row in series["intervals"]) == 12 and series["devices"] == 1
    manifest = json.loads((tmp_path / "out" / "_manifest.json").read_text())
    usage = manifest["usage"]
    assert usage["prompt_tokens"] == summary.prompt_tokens and usage["output_tokens"] == summary.output_tokens
    assert usage["computed_prompt_tokens"] == summary.prompt_tokens - summary.cached_tokens
    assert usage["device_seconds"] == summary.device_seconds and manifest["charts"][0] == "_throughput.svg"
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["status", str(tmp_path / "out")]) == 0
    text = out.getvalue()
    assert "throughput over time" in text and "local" in text and "device-seconds" in text
    with contextlib.redirect_stdout(out := io.StringIO()):
        assert main(["status", str(tmp_path / "out"), "--json"]) == 0
    status = json.loads(out.getvalue())
    assert status["usage"]["device_seconds"] > 0 and status["throughput"]["lanes"][0]["rows"] == 12
