"""SIGKILL a running job (inside a flush, inside a commit, at random points), resume it, and check that
the committed output holds exactly one row per input id with the same outputs as an uninterrupted run."""

from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import yaml

from prefixflow.pipeline import load_job, status
from prefixflow.pipeline.hooks import SHARD_POINTS
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import job, write_dataset

REPO = Path(__file__).resolve().parents[2]
JOB = job("generate", output={"shard_rows": 6, "flush_rows": 2})
# every shard (6 or 3 rows) in one part: publish: direct writes it into data/ before its marker
DIRECT_JOB = job("generate", output={"shard_rows": 6, "flush_rows": 64})


def _command(inp: Path, out: str, job_file: Path, endpoint: str | None) -> list[str]:
    extra = ["--endpoint-url", endpoint] if endpoint else []
    return [
        sys.executable,
        "-m",
        "prefixflow.pipeline.cli",
        "run",
        "--input",
        str(inp),
        "--output",
        out,
        "--model",
        "tiny",
        "--job",
        str(job_file),
        "--no-progress",
        *extra,
    ]


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


def _committed(out: str, endpoint: str | None) -> pl.DataFrame:
    """Every row a reader of OUTPUT/data/**/*.parquet sees right now."""
    if endpoint is None:
        files = list(Path(out, "data").rglob("*.parquet"))
        return (
            pl.concat([pl.read_parquet(f) for f in files])
            if files
            else pl.DataFrame({"id": [], "output": []})
        )
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    fs.invalidate_cache()
    files = [f for f in fs.find(out.removeprefix("s3://") + "/data") if f.endswith(".parquet")]
    frames = [pl.read_parquet(fs.cat_file(f)) for f in files]
    return pl.concat(frames) if frames else pl.DataFrame({"id": [], "output": []})


def _check_kills(
    tmp_path: Path,
    tiny_llm,
    trials: list[tuple[str, int]],
    out: str | None = None,
    endpoint: str | None = None,
    config: dict | None = None,
) -> int:
    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=9, row_group_size=3)
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(config or JOB))
    reference, _ = run_local(
        load_job(str(tmp_path / "in"), str(tmp_path / "ref"), "tiny", str(job_file)),
        llm=tiny_llm,
        progress=False,
    )
    expected = dict(pl.read_parquet(reference.data_glob).select("id", "output").iter_rows())
    out = out or str(tmp_path / "out")
    cmd = _command(tmp_path / "in", out, job_file, endpoint)
    kills = 0
    for point, nth in trials:
        kills += _run_until(cmd, point, nth)
        partial = _committed(out, endpoint)
        assert partial["id"].n_unique() == partial.height  # never a duplicate, even mid-run
    assert kills >= 1
    _run_until(cmd, None, 0)
    final = _committed(out, endpoint)
    assert sorted(final["id"].to_list()) == sorted(ids)  # exactly one committed row per input id
    assert dict(final.select("id", "output").iter_rows()) == expected  # greedy: same outputs
    assert not list(tmp_path.rglob(".tmp-*"))
    return kills


def test_kill_during_flush_and_commit_then_resume(tmp_path: Path, tiny_llm) -> None:
    assert _check_kills(tmp_path, tiny_llm, [("flush_mid", 2), ("publish_mid", 1)]) == 2


def test_kill_between_direct_parts_and_their_markers_then_resume(tmp_path: Path, tiny_llm) -> None:
    """publish: direct: a kill right after a shard's part appeared in data/ (before its marker), then one
    right after the next attempt's marker, then one as a later commit begins: data/ never shows a row
    twice, every resume keeps the direct parts a killed attempt left (none is regenerated or copied),
    and the final run leaves only direct parts, nothing staged and no orphans."""
    trials = [("flush_end", 2), ("commit_marker", 1), ("commit_begin", 2)]
    assert _check_kills(tmp_path, tiny_llm, trials, config=DIRECT_JOB) == 3
    out = tmp_path / "out"
    names = sorted(p.name for p in (out / "data").rglob("*.parquet"))
    assert len(names) == 4 and all(re.fullmatch(r"part-direct-\d{5,}\.parquet", n) for n in names)
    assert not [p for p in (out / "_staging").rglob("*") if p.is_file()]
    summary, _ = status(str(out))
    assert summary.complete and summary.orphan_parts == [] and summary.foreign_files == []


@pytest.mark.slow
def test_kill_at_random_points_then_resume(tmp_path: Path, tiny_llm) -> None:
    rng = random.Random(int(os.environ.get("PREFIXFLOW_KILL_SEED", "7")))
    trials = [("commit_marker", 1)] + [(rng.choice(SHARD_POINTS), rng.randint(1, 3)) for _ in range(4)]
    _check_kills(tmp_path, tiny_llm, trials)


@pytest.mark.slow
def test_kill_with_s3_output_then_resume(tmp_path: Path, tiny_llm, s3_endpoint: str) -> None:
    """The same on S3 (moto's server): conditional-PUT markers and server-side copies."""
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir("kill-bucket")
    trials = [("flush_mid", 2), ("commit_marker", 1), ("publish_mid", 1)]
    assert _check_kills(tmp_path, tiny_llm, trials, out="s3://kill-bucket/out", endpoint=s3_endpoint) == 3


@pytest.mark.slow
def test_kill_between_direct_parts_and_their_markers_on_s3(
    tmp_path: Path, tiny_llm, s3_endpoint: str
) -> None:
    """The same on S3: the direct part is one conditional PUT (If-None-Match) into data/."""
    import s3fs

    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir("kill-direct")
    trials = [("flush_end", 2), ("commit_marker", 1), ("commit_begin", 2)]
    out = "s3://kill-direct/out"
    assert _check_kills(tmp_path, tiny_llm, trials, out=out, endpoint=s3_endpoint, config=DIRECT_JOB) == 3
