"""The `prefixflow` command as a user runs it: a subprocess, its exit code and its output."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

from prefixflow.pipeline import load_job
from prefixflow.pipeline.cli import main
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import job, write_dataset

REPO = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prefixflow.pipeline.cli", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_help_names_every_command() -> None:
    res = _cli("--help")
    assert res.returncode == 0
    for word in ("run", "plan", "status", "demo", "examples"):
        assert word in res.stdout
    version = _cli("--version")
    assert version.returncode == 0 and re.fullmatch(r"prefixflow \S+\n", version.stdout)
    for command, phrase in (
        ("plan", "row-group boundaries"),
        ("demo", "WORKDIR/<model>/"),
        ("status", "per lane"),
        ("run", "stdout"),
    ):
        helped = _cli(command, "--help")
        assert helped.returncode == 0 and phrase in " ".join(helped.stdout.split()), command
    serve = subprocess.run(
        [sys.executable, "-m", "prefixflow.flows.cli", "serve", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    flat = " ".join(serve.stdout.split())
    assert (
        "--interval SECONDS run every SECONDS" in flat
        and "--storage-option KEY=VALUE fsspec storage option" in flat
    )


def test_reports_go_to_stdout_progress_and_logs_to_stderr(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=4)
    plan = _cli("plan", "--input", str(tmp_path / "in"))
    assert (
        plan.returncode == 0 and "1 shards, 4 rows" in plan.stdout and plan.stderr == ""
    )  # `plan > plan.txt`
    args = [
        "run",
        "--input",
        str(tmp_path / "in"),
        "--output",
        str(tmp_path / "out"),
        "--model",
        "tiny",
        "--prompt-column",
        "text",
        "--max-tokens",
        "2",
        "--engine",
        "max_model_len=160",
    ]
    run = _cli(*args)
    assert run.returncode == 0, run.stderr
    assert "prefixflow run summary" in run.stdout and "read with polars.scan_parquet" in run.stdout
    assert "prefixflow progress: 4/4 rows" in run.stderr and "prefixflow progress" not in run.stdout
    as_json = _cli(*args, "--json")  # machine-readable: stdout is the JSON document alone
    assert json.loads(as_json.stdout)["rows"] == 4 and "prefixflow run summary" in as_json.stderr


def test_serve_dispatches_to_flows_when_installed() -> None:
    res = subprocess.run(
        [sys.executable, "-m", "prefixflow.flows.cli", "serve", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    assert "prefixflow serve" in res.stdout


def test_plan_json(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=2, rows_per_file=12)
    res = _cli("plan", "--input", str(tmp_path / "in"), "--shard-rows", "10", "--json")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["num_rows"] == 24 and len(plan["shards"]) == 4
    assert all(s["est_tokens"] > 0 and s["error"] is None for s in plan["shards"])


def test_plan_fails_with_exit_2_on_input_that_is_not_parquet(tmp_path: Path) -> None:
    (tmp_path / "rows.jsonl").write_text('{"id": 1, "text": "hello"}\n')
    res = _cli("plan", "--input", str(tmp_path / "rows.jsonl"))
    assert (
        res.returncode == 2 and "rows.jsonl is neither a Parquet file nor an OpenAI Batch file" in res.stderr
    )
    write_dataset(tmp_path / "in", files=1, rows_per_file=4)  # a broken file inside a folder
    (tmp_path / "in" / "broken.parquet").write_bytes(b"PAR1 cut short")
    res = _cli("plan", "--input", str(tmp_path / "in"))
    assert res.returncode == 2 and "broken.parquet" in res.stderr and "cannot read Parquet file" in res.stderr


def test_bad_config_exits_2_with_the_key(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1)
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"task": "summarize", "summarize": {"long_document": "skip"}}))
    res = _cli("run", "--input", str(tmp_path / "in"), "--output", str(tmp_path / "out"), "--job", str(bad))
    assert res.returncode == 2
    assert "summarize.long_document" in res.stderr and "error, truncate, map_reduce" in res.stderr
    res = _cli("plan", "--input", str(tmp_path / "missing"))
    assert res.returncode == 2 and "does not exist" in res.stderr


def test_status_of_a_finished_and_an_unfinished_run(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=2, rows_per_file=4)
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate"))
    run_local(spec, llm=tiny_llm, progress=False)
    res = _cli("status", str(tmp_path / "out"), "--json")
    assert res.returncode == 0, res.stderr
    status = json.loads(res.stdout)
    assert (
        status["complete"]
        and status["rows"] == 8
        and status["shards_committed"] == status["shards_total"] == 1  # two small files, packed
    )
    write_dataset(tmp_path / "in", files=3, rows_per_file=4)  # a new input file: the run is now behind
    res = _cli("status", str(tmp_path / "out"))
    assert res.returncode == 0 and "not finished" in res.stdout and "1 / 2" in res.stdout  # a report: stdout


def test_threads_flag_refuses_zero(tmp_path: Path) -> None:
    res = _cli("demo", "--model", "tiny", "--threads", "0", "--workdir", str(tmp_path / "demo"))
    assert res.returncode == 2 and "--threads: must be at least 1, got 0" in res.stderr
    assert not (tmp_path / "demo").exists()  # refused before anything is written


def test_status_of_a_non_run_folder(tmp_path: Path) -> None:
    assert main(["status", str(tmp_path)]) == 2


def test_demo_with_the_tiny_model(tmp_path: Path) -> None:
    res = _cli("demo", "--model", "tiny", "--rows", "6", "--workdir", str(tmp_path / "demo"))
    assert res.returncode == 0, res.stderr
    assert "pl.read_parquet" in res.stdout and "label_probs" in res.stdout  # results on stdout
    assert "sample rows" in res.stdout and "sample rows" not in res.stderr
    timing = r"time per job: load model [\d.]+ s, summarize [\d.]+ s, label [\d.]+ s, extract [\d.]+ s; total [\d.]+ s \(CPU [\d.]+ s"
    assert re.search(timing, res.stdout), res.stdout[-500:]  # issue 24: the time per job, at the end
    # per-job CPU-seconds and the compute threads (OMP_NUM_THREADS=1 from conftest is kept)
    cpu = r"\(CPU [\d.]+ s: load model [\d.]+, summarize [\d.]+, label [\d.]+, extract [\d.]+; load average [\d.]+, 1 compute thread\)"
    assert re.search(cpu, res.stdout), res.stdout[-500:]
    import polars as pl

    results = tmp_path / "demo" / "tiny-6rows"
    summaries = pl.read_parquet(str(results / "summarize-out" / "data" / "**" / "*.parquet"))
    labels = pl.read_parquet(str(results / "label-out" / "data" / "**" / "*.parquet"))
    assert summaries.height == labels.height == 6
    assert summaries["error"].null_count() == 6 and set(labels["label"]) <= {
        "positive",
        "negative",
        "neutral",
    }
    extracted = pl.read_parquet(str(results / "extract-out" / "data" / "**" / "*.parquet"))
    assert extracted.height == 6 and "extracted" in res.stdout  # the demo's results are on stdout
    assert extracted.schema["extracted"] == pl.Struct(
        {"sentiment": pl.String, "product": pl.String, "issues": pl.List(pl.String)}
    )
    for row in extracted.to_dicts():  # random weights: a complete object, or cut by max_tokens
        assert (row["extracted"] is not None and json.loads(row["output"]) == row["extracted"]) or row[
            "error_class"
        ] == "truncated_json"


def test_demo_keeps_each_models_results_apart(tmp_path: Path) -> None:
    """`demo --model tiny` after a demo with another model must not replace that model's results."""
    from prefixflow.engine.loading.presets import hf_config_of, load_preset, save_random_model
    from prefixflow.pipeline.demo import model_folder

    other = tmp_path / "models" / "my-model"
    save_random_model(hf_config_of(load_preset("tiny")), other, seed=1)
    workdir = tmp_path / "demo"
    assert main(["demo", "--model", str(other), "--rows", "3", "--workdir", str(workdir)]) == 0
    first = workdir / model_folder(str(other), 3)
    assert first.name.startswith("my-model-") and first.name.endswith("-3rows")
    before = {p: p.stat().st_mtime_ns for p in first.rglob("*.parquet")}
    assert before
    assert main(["demo", "--model", "tiny", "--rows", "3", "--workdir", str(workdir)]) == 0
    assert (workdir / "tiny-3rows" / "label-out" / "data").is_dir()
    assert {p: p.stat().st_mtime_ns for p in first.rglob("*.parquet")} == before
    assert (
        len({model_folder(m, 24) for m in ("tiny", "smollm2-135m-instruct", "/a/m.gguf", "/b/m.gguf")}) == 4
    )


def test_run_exits_1_when_a_shard_fails_and_reports_it(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    (tmp_path / "in" / "zz-broken.parquet").write_bytes(b"not parquet at all")
    res = _cli(
        "run",
        "--input",
        str(tmp_path / "in"),
        "--output",
        str(tmp_path / "out"),
        "--model",
        "tiny",
        "--prompt-column",
        "text",
        "--max-tokens",
        "2",
        "--no-progress",
        "--json",
    )
    assert res.returncode == 1, res.stderr
    assert "zz-broken.parquet" in res.stderr and "1 shard(s) failed" in res.stderr
    summary = json.loads(res.stdout)
    assert summary["rows"] == 3 and not summary["complete"] and len(summary["failed_shards"]) == 1


def test_bad_quantization_exits_2_naming_it(tmp_path: Path, capsys) -> None:
    write_dataset(tmp_path / "in", files=1)
    code = main(
        [
            "run",
            "--input",
            str(tmp_path / "in"),
            "--output",
            str(tmp_path / "out"),
            "--model",
            "tiny",
            "--quantization",
            "int3",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2 and "quantization='int3'" in err and "int8, int4, fp8" in err
    assert not (tmp_path / "out").exists() or not any((tmp_path / "out").rglob("*.parquet"))
