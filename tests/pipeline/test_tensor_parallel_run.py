"""`prefixflow run --tensor-parallel-size 2` end to end: every row written exactly once, the same rows
as one rank writes, and no worker process left behind when the command exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import polars as pl
import pytest

from prefixflow.pipeline import load_job
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import write_dataset

REPO = Path(__file__).resolve().parents[2]
FLAGS = [
    "--model",
    "tiny",
    "--prompt-column",
    "text",
    "--id-column",
    "id",
    "--max-tokens",
    "6",
    "--shard-rows",
    "7",
]


@pytest.mark.slow
def test_run_with_two_ranks_writes_every_row_once(tmp_path: Path) -> None:
    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=9)
    mark = uuid.uuid4().hex  # inherited by the command's worker processes: finds them afterwards
    res = subprocess.run(
        [
            sys.executable,
            "-m",
            "prefixflow.pipeline.cli",
            "run",
            "--input",
            str(tmp_path / "in"),
            "--output",
            str(tmp_path / "tp2"),
            *FLAGS,
            "--tensor-parallel-size",
            "2",
            "--no-progress",
            "--json",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "PREFIXFLOW_TEST_MARK": mark},
    )
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["complete"] and summary["rows"] == len(ids) and summary["error_rows"] == 0
    assert not _marked_processes(mark), "a tensor-parallel worker outlived the command"

    two = pl.read_parquet(str(tmp_path / "tp2" / "data" / "**" / "*.parquet"))
    assert sorted(two["id"].to_list()) == sorted(ids)  # every row, exactly once

    spec = load_job(
        str(tmp_path / "in"),
        str(tmp_path / "tp1"),
        "tiny",
        None,
        prompt_column="text",
        id_column="id",
        max_tokens=6,
        shard_rows=7,
    )
    run_local(spec, progress=False)
    one = pl.read_parquet(str(tmp_path / "tp1" / "data" / "**" / "*.parquet"))
    joined = two.select("id", "output").join(one.select("id", "output"), on="id", suffix="_tp1")
    assert len(joined) == len(ids) and joined["output"].to_list() == joined["output_tp1"].to_list()


def test_the_flag_sets_the_engine_option() -> None:
    from prefixflow.pipeline.cli import build_parser
    from prefixflow.pipeline.job.flags import overrides_from_args

    args = build_parser().parse_args(["run", "--input", "i", "--output", "o", "--tensor-parallel-size", "2"])
    spec = load_job("i", "o", "tiny", None, **overrides_from_args(args))
    assert spec.config.engine == {"tensor_parallel_size": 2}
    assert "tensor_parallel_size" not in spec.fingerprint()["job"]["engine"]  # a resume may change it


def _marked_processes(mark: str) -> list[int]:
    found = []
    needle = f"PREFIXFLOW_TEST_MARK={mark}".encode()
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read():
                        found.append(int(entry))
            except OSError:
                pass
    return found
