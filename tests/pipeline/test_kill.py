"""SIGKILL a running job (inside a flush, inside a commit, at random points), resume it, and check that
the committed output holds exactly one row per input id with the same outputs as an uninterrupted run."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from pipeline import load_job
from pipeline.hooks import POINTS
from pipeline.local_run import run_local
from tests.pipeline.support import job, write_dataset

REPO = Path(__file__).resolve().parents[2]
JOB = job("generate", output={"shard_rows": 6, "flush_rows": 2})


def _command(inp: Path, out: Path, job_file: Path) -> list[str]:
    return [sys.executable, "-m", "pipeline.cli", "run", "--input", str(inp), "--output", str(out),
            "--model", "tiny", "--job", str(job_file), "--no-progress"]  # fmt: skip


def _run_until(cmd: list[str], point: str | None, nth: int) -> bool:
    """Run the job; SIGKILL it while it is paused at the nth time it reaches ``point``. True if killed."""
    env = dict(os.environ, PREFIXFLOW_TEST_HOOKS="1" if point else "", PREFIXFLOW_TEST_HOOK_SLEEP="0.5")
    proc = subprocess.Popen(
        cmd, cwd=REPO, env=env, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True
    )
    seen = 0
    assert proc.stderr is not None
    for line in proc.stderr:
        if point and line.strip() == f"HOOK {point}":
            seen += 1
            if seen == nth:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
    assert proc.wait(timeout=300) == 0 or point, "the uninterrupted run failed"
    return False


def _committed(out: Path) -> pl.DataFrame:
    files = list((out / "data").rglob("*.parquet"))
    return pl.read_parquet(files) if files else pl.DataFrame({"id": [], "output": []})


def _check_kills(tmp_path: Path, tiny_llm, trials: list[tuple[str, int]]) -> int:
    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=9, row_group_size=3)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(JOB))
    reference, _ = run_local(load_job(str(tmp_path / "in"), str(tmp_path / "ref"), "tiny", str(job_file)),
                             llm=tiny_llm, progress=False)  # fmt: skip
    expected = dict(pl.read_parquet(reference.data_glob).select("id", "output").iter_rows())
    cmd = _command(tmp_path / "in", tmp_path / "out", job_file)
    kills = 0
    for point, nth in trials:
        kills += _run_until(cmd, point, nth)
        partial = _committed(tmp_path / "out")
        assert partial["id"].n_unique() == partial.height  # never a duplicate, even mid-run
    assert kills >= 1
    _run_until(cmd, None, 0)
    final = _committed(tmp_path / "out")
    assert sorted(final["id"].to_list()) == sorted(ids)  # exactly one committed row per input id
    assert dict(final.select("id", "output").iter_rows()) == expected  # greedy: same outputs
    assert not list((tmp_path / "out").rglob(".tmp-*"))
    return kills


def test_kill_during_flush_and_commit_then_resume(tmp_path: Path, tiny_llm) -> None:
    assert _check_kills(tmp_path, tiny_llm, [("flush_mid", 2), ("publish_mid", 1)]) == 2


@pytest.mark.slow
def test_kill_at_random_points_then_resume(tmp_path: Path, tiny_llm) -> None:
    rng = random.Random(int(os.environ.get("PREFIXFLOW_KILL_SEED", "7")))
    trials = [("commit_marker", 1)] + [(rng.choice(POINTS), rng.randint(1, 3)) for _ in range(4)]
    _check_kills(tmp_path, tiny_llm, trials)
