"""Kill chaos: SIGKILLs at random pause points, interleaved with --new-run and with concurrent runs of the
same and of another job. After every step, what readers of OUTPUT/data/**/*.parquet see is one job's rows,
each input row at most once; in the end, exactly once. No process may fail other than by being killed
or by a clear refusal (exit 2): a crash (exit 1, a traceback) fails the test. Between a kill and the next
run the input is sometimes edited (a row removed or put back): resuming over it is refused, a --new-run
starts over, and a run that ends well shows exactly the current input's rows.

PREFIXFLOW_CHAOS_SEED picks the trials (default 11); PREFIXFLOW_CHAOS_TRIALS how many (default 8)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq
import pytest

from prefixflow.pipeline import load_job
from prefixflow.pipeline.hooks import POINTS
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import cli_args, job, start_cli, write_dataset, write_job, write_parquet

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

OUTPUT = {"shard_rows": 3, "flush_rows": 2}
JOBS = {
    "A": job("generate", sampling={"max_tokens": 6, "ignore_eos": True}, output=OUTPUT),
    "B": job("generate", sampling={"max_tokens": 2, "ignore_eos": True}, output=OUTPUT),
}


def _rows(out: Path) -> pl.DataFrame:
    files = sorted((out / "data").rglob("*.parquet")) if (out / "data").exists() else []
    frames = [pl.read_parquet(f).select("id", "output", "output_tokens") for f in files]
    return (
        pl.concat(frames)
        if frames
        else pl.DataFrame(schema={"id": pl.String, "output": pl.String, "output_tokens": pl.Int64})
    )


def _one_jobs_rows(out: Path, refs: dict[str, dict[str, str]]) -> str | None:
    """Which job the visible rows belong to (None when there are none); fails on duplicates or a mix."""
    rows = _rows(out)
    ids = rows["id"].to_list()
    assert len(ids) == len(set(ids)), f"an input row is committed twice: {sorted(ids)}"
    if not ids:
        return None
    got = dict(rows.select("id", "output").iter_rows())
    owners = [name for name, ref in refs.items() if all(ref[i] == text for i, text in got.items())]
    assert owners, f"the committed rows mix runs: {sorted(set(rows['output_tokens']))} output tokens"
    return owners[0]


def _kill_at(proc: subprocess.Popen[str], point: str, nth: int) -> bool:
    """SIGKILL ``proc`` the nth time it pauses at ``point``; True if it was killed, False if it ended."""
    assert proc.stderr is not None
    seen = 0
    for line in proc.stderr:
        if line.strip() == f"HOOK {point}":
            seen += 1
            if seen == nth:
                proc.send_signal(signal.SIGKILL)
                proc.wait()
                return True
    proc.wait(timeout=300)
    return False


def _toggle_last_row(folder: Path, rows: list[dict[str, str]]) -> list[str]:
    """Remove the last row of part-1.parquet, or put it back; returns the input's ids afterwards. A resume
    of a run over the other version must be refused (exit 2), and a --new-run must start over."""
    path = folder / "part-1.parquet"
    now = pq.read_table(path).num_rows
    write_parquet(path, rows[:-1] if now == len(rows) else rows, row_group_size=3)
    return sorted(pl.read_parquet(str(folder / "*.parquet"))["id"].to_list())


def test_kill_chaos_with_new_run_and_concurrent_runs(tmp_path: Path, tiny_llm) -> None:
    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=6, row_group_size=3)
    rows = pq.read_table(tmp_path / "in" / "part-1.parquet").to_pylist()
    files = {name: write_job(tmp_path / f"{name}.yaml", cfg) for name, cfg in JOBS.items()}
    refs = {}
    for name, cfg in JOBS.items():
        summary, _ = run_local(
            load_job(str(tmp_path / "in"), str(tmp_path / f"ref-{name}"), "tiny", cfg),
            llm=tiny_llm,
            progress=False,
        )
        refs[name] = dict(pl.read_parquet(summary.data_glob).select("id", "output").iter_rows())
    assert refs["A"] != refs["B"]
    out = tmp_path / "out"
    rng = random.Random(int(os.environ.get("PREFIXFLOW_CHAOS_SEED", "11")))
    kills = refusals = edits = 0
    current = sorted(ids)
    for _ in range(int(os.environ.get("PREFIXFLOW_CHAOS_TRIALS", "8"))):
        name = rng.choice("AB")
        extra = ["--new-run"] if rng.random() < 0.5 else []
        first = start_cli(cli_args(tmp_path / "in", out, files[name], *extra), hooks="1", hook_sleep=0.05)
        second = None
        if rng.random() < 0.5:  # a concurrent run: the same job, or the other one with --new-run
            other = rng.choice("AB")
            more = ["--new-run"] if other != name or rng.random() < 0.5 else []
            second = start_cli(cli_args(tmp_path / "in", out, files[other], *more))
        point, nth = rng.choice(POINTS), rng.randint(1, 4)
        killed = _kill_at(first, point, nth) if rng.random() < 0.8 else (first.wait(timeout=300) or False)
        codes = [] if killed else [first.returncode]
        if second is not None:
            second.wait(timeout=300)
            codes.append(second.returncode)
        assert set(codes) <= {0, 2}, f"a run crashed: exit codes {codes}"
        kills += killed
        refusals += codes.count(2)
        _one_jobs_rows(out, refs)
        if second is None and codes == [0]:  # a run that ended well: the current input's rows, each once
            assert sorted(_rows(out)["id"].to_list()) == current, (
                "a finished run lost rows or kept deleted ones"
            )
        if killed and (edits == 0 or rng.random() < 0.3):  # issue 22: edit the input before the resume
            current = _toggle_last_row(tmp_path / "in", rows)
            edits += 1
    print(f"chaos: {kills} kills, {refusals} refusals, {edits} input edits")
    assert kills >= 3 and edits >= 1
    final = start_cli(cli_args(tmp_path / "in", out, files["A"], "--new-run"))
    _, err = final.communicate(timeout=300)
    assert final.returncode == 0, err
    assert _one_jobs_rows(out, refs) == "A"
    assert sorted(_rows(out)["id"].to_list()) == current
    assert not list((out / "_leases").glob("*.json"))
