"""A one-off job needs no YAML: --task, --labels, --template, --temperature and --max-tokens on the command line."""

from __future__ import annotations

from pathlib import Path

import polars as pl

from prefixflow.pipeline.cli import build_parser, main
from prefixflow.pipeline.job.flags import overrides_from_args
from prefixflow.pipeline.job.spec import load_job
from tests.pipeline.support import ENGINE, write_dataset

ENGINE_FLAGS = [f"--engine={k}={v}" for k, v in ENGINE.items()]


def test_flags_build_the_job() -> None:
    args = build_parser().parse_args(
        [
            "run",
            "--input",
            "in",
            "--output",
            "out",
            "--task",
            "label",
            "--labels",
            "positive, negative,neutral",
            "--template",
            "Review: {{ text }}",
            "--temperature",
            "0.7",
            "--max-tokens",
            "9",
            "--system-prompt",
            "Be terse.",
        ]
    )
    spec = load_job("in", "out", "tiny", None, **overrides_from_args(args))
    cfg = spec.config
    assert cfg.task == "label" and cfg.label.labels == ("positive", "negative", "neutral")
    assert cfg.template == "Review: {{ text }}" and cfg.system_prompt == "Be terse."
    assert cfg.sampling.given() == {"temperature": 0.7, "max_tokens": 9}


def test_a_labeling_job_from_flags_alone(tmp_path: Path, capsys) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=4)
    argv = [
        "run",
        "--input",
        str(tmp_path / "in"),
        "--output",
        str(tmp_path / "out"),
        "--model",
        "tiny",
        "--task",
        "label",
        "--labels",
        "positive,negative",
        "--template",
        "Sentiment of: {{ text }}",
        "--id-column",
        "id",
        "--no-progress",
        *ENGINE_FLAGS,
    ]
    assert main(argv) == 0
    df = pl.read_parquet(str(tmp_path / "out" / "data" / "**" / "*.parquet"))
    assert df.height == 4 and set(df["label"]) <= {"positive", "negative"} and df["error"].null_count() == 4
    assert main([*argv[: -len(ENGINE_FLAGS) - 1], "--labels", "x"]) == 2  # one label is not a labeling job
    assert "at least two labels" in capsys.readouterr().err
