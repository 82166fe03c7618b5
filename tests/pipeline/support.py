"""Helpers shared by the pipeline tests: small Parquet datasets and the test engine settings."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

# Small engine settings shared by every test that runs the tiny model (in-process or in a subprocess),
# so their job fingerprints agree and greedy outputs are comparable.
ENGINE = {"max_model_len": 160, "max_num_seqs": 32}
MODEL = "tiny"


def docs(n: int, start: int = 0) -> list[dict[str, Any]]:
    words = ["apple", "river", "stone", "cloud", "ember", "maple", "north", "quiet"]
    return [
        {
            "id": f"doc-{i:04d}",
            "title": f"title {i}",
            "text": " ".join(words[(i + k) % len(words)] for k in range(3 + i % 5)),
        }
        for i in range(start, start + n)
    ]


def write_parquet(
    path: Path, rows: list[dict[str, Any]], row_group_size: int = 5, schema: pa.Schema | None = None
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=row_group_size)
    return path


def write_dataset(
    folder: Path, files: int = 2, rows_per_file: int = 12, row_group_size: int = 5
) -> list[str]:
    ids = []
    for f in range(files):
        rows = docs(rows_per_file, start=f * rows_per_file)
        write_parquet(folder / f"part-{f}.parquet", rows, row_group_size)
        ids += [r["id"] for r in rows]
    return ids


def job(task: str = "generate", **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "task": task,
        "id_column": "id",
        "engine": dict(ENGINE),
        "sampling": {"max_tokens": 4},
        "output": {"shard_rows": 10, "flush_rows": 4},
    }
    if task == "generate":
        base["template"] = "Write about {{ text }}"
    if task == "label":
        base["template"] = "Sentiment of: {{ text }}"
        base["label"] = {"labels": ["positive", "negative", "neutral"]}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base


REPO = Path(__file__).resolve().parents[2]


def cli_args(inp: Path, out: Path | str, job_file: Path, *extra: str) -> list[str]:
    """`prefixflow run` arguments for the tiny model (as a user would type them, minus the program)."""
    return [
        "run",
        "--input",
        str(inp),
        "--output",
        str(out),
        "--model",
        MODEL,
        "--job",
        str(job_file),
        "--no-progress",
        *extra,
    ]


def start_cli(args: list[str], hooks: str = "", hook_sleep: float = 0.2, **env: str) -> subprocess.Popen[str]:
    """`python -m prefixflow.pipeline.cli ARGS` as a subprocess; ``hooks`` names pipeline/hooks.py points
    to pause at (their names then appear on stderr as ``HOOK <name>``)."""
    full_env = dict(
        os.environ, PREFIXFLOW_TEST_HOOKS=hooks, PREFIXFLOW_TEST_HOOK_SLEEP=str(hook_sleep), **env
    )
    return subprocess.Popen(
        [sys.executable, "-m", "prefixflow.pipeline.cli", *args],
        cwd=REPO,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for_hook(proc: subprocess.Popen[str], point: str, timeout_s: float = 240) -> list[str]:
    """Read the process's stderr until it reports ``HOOK point``; return the lines read. Fails if the
    process ends (or the time runs out) first."""
    assert proc.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout_s
    for line in proc.stderr:
        lines.append(line)
        if line.strip() == f"HOOK {point}":
            return lines
        assert time.monotonic() < deadline, f"no HOOK {point} within {timeout_s}s: {''.join(lines[-20:])}"
    raise AssertionError(f"the process ended (rc {proc.wait()}) before HOOK {point}: {''.join(lines[-20:])}")


def write_job(path: Path, config: dict[str, Any]) -> Path:
    path.write_text(yaml.safe_dump(config))
    return path
