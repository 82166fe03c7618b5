"""--new-run against kills, concurrent runs and other people's files (issue 10, items 3 and 4).

Job A writes rows of 12 output tokens, job B rows of 3 (ignore_eos), so every output row says which
run wrote it."""

from __future__ import annotations

import json
import shutil
import signal
from pathlib import Path

import polars as pl
import pytest

from prefixflow.pipeline import load_job, prepare_output, status
from prefixflow.pipeline.cli import main
from prefixflow.pipeline.local_run import run_local
from prefixflow.pipeline.storage.store import Store
from tests.pipeline.support import cli_args, job, start_cli, wait_for_hook, write_dataset, write_job

JOB_A = job(
    "generate", sampling={"max_tokens": 12, "ignore_eos": True}, output={"shard_rows": 6, "flush_rows": 3}
)
JOB_B = job(
    "generate", sampling={"max_tokens": 3, "ignore_eos": True}, output={"shard_rows": 6, "flush_rows": 3}
)


def _committed(out: Path) -> pl.DataFrame:
    return pl.read_parquet(str(out / "data" / "**" / "*.parquet"))


def _setup(tmp_path: Path, tiny_llm) -> tuple[list[str], Path]:
    """Job A run to completion into tmp/out."""
    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=6, row_group_size=3)
    out = tmp_path / "out"
    summary, failures = run_local(
        load_job(str(tmp_path / "in"), str(out), "tiny", JOB_A), llm=tiny_llm, progress=False
    )
    assert summary.complete and not failures and set(_committed(out)["output_tokens"]) == {12}
    return ids, out


def test_a_crash_inside_new_run_never_lets_the_old_rows_count(tmp_path: Path, tiny_llm, monkeypatch) -> None:
    """Issue 10 item 3(a): --new-run dies while removing the old run; re-running the new job must not
    report the old run's shards as committed."""
    ids, out = _setup(tmp_path, tiny_llm)
    spec_b = load_job(str(tmp_path / "in"), str(out), "tiny", JOB_B)
    real_remove = Store.remove_tree

    def crash_on_old_results(self, path, *args, **kwargs):
        if "/_commits" in path or "/data" in path:
            raise KeyboardInterrupt("simulated kill while the old run is being removed")
        return real_remove(self, path, *args, **kwargs)

    monkeypatch.setattr(Store, "remove_tree", crash_on_old_results)
    with pytest.raises(KeyboardInterrupt):
        prepare_output(spec_b, new_run=True)
    monkeypatch.setattr(Store, "remove_tree", real_remove)
    summary, failures = run_local(spec_b, llm=tiny_llm, progress=False)  # the same command, resumed
    rows = _committed(out)
    assert summary.complete and not failures and summary.rows == len(ids)
    assert sorted(rows["id"]) == sorted(ids) and set(rows["output_tokens"]) == {3}


@pytest.mark.slow  # a subprocess; the in-process crash test above covers the same window in the default run
def test_sigkill_right_after_the_new_run_record_then_rerun(tmp_path: Path, tiny_llm, capsys) -> None:
    """The same with a real SIGKILL at the riskiest point: new record written, old run not yet removed."""
    ids, out = _setup(tmp_path, tiny_llm)
    job_b = write_job(tmp_path / "b.yaml", JOB_B)
    proc = start_cli(
        cli_args(tmp_path / "in", out, job_b, "--new-run"), hooks="new_run_recorded", hook_sleep=60
    )
    try:
        wait_for_hook(proc, "new_run_recorded")
    finally:
        proc.kill()
        proc.wait()
    record = json.loads((out / "_prefixflow.json").read_text())
    assert (
        record["fingerprint_hash"]
        == load_job(str(tmp_path / "in"), str(out), "tiny", JOB_B).fingerprint_hash()
    )
    assert set(_committed(out)["output_tokens"]) == {12}  # only the old run's rows are visible, still whole
    assert main(["status", str(out)]) == 0
    assert "hold rows of a replaced run" in capsys.readouterr().err
    assert main(cli_args(tmp_path / "in", out, job_b)) == 0
    rows = _committed(out)
    assert sorted(rows["id"]) == sorted(ids) and set(rows["output_tokens"]) == {3}
    assert sorted(p.name for p in (out / "data").iterdir()) == [record["run_id"]]


def test_new_run_is_refused_while_another_run_writes_the_output(tmp_path: Path, capsys) -> None:
    """Issue 10 item 3(b): A is running (its first marker exists) when B asks for --new-run."""
    ids = write_dataset(tmp_path / "in", files=2, rows_per_file=6, row_group_size=3)
    out = tmp_path / "out"
    job_a, job_b = write_job(tmp_path / "a.yaml", JOB_A), write_job(tmp_path / "b.yaml", JOB_B)
    proc = start_cli(cli_args(tmp_path / "in", out, job_a), hooks="commit_marker", hook_sleep=0.1)
    try:
        wait_for_hook(proc, "commit_marker")
        proc.send_signal(signal.SIGSTOP)  # hold A right after its first commit while B tries
        try:
            assert main(cli_args(tmp_path / "in", out, job_b, "--new-run")) == 2
        finally:
            proc.send_signal(signal.SIGCONT)
        err = capsys.readouterr().err
        # refused by A's driver lease (one run per output), before B's --new-run could discard anything
        assert "already being written by another run" in err and f"pid {proc.pid}" in err
        assert proc.wait(timeout=300) == 0, proc.stderr.read() if proc.stderr else ""
    finally:
        proc.kill()
    summary, _ = status(str(out))
    rows = _committed(out)
    assert summary.complete and summary.rows == len(ids) == rows.height
    assert sorted(rows["id"]) == sorted(ids) and set(rows["output_tokens"]) == {12}
    assert main(cli_args(tmp_path / "in", out, job_a)) == 0  # later runs still work: all committed


def test_new_run_never_deletes_a_folder_that_is_not_a_prefixflow_run(tmp_path: Path, capsys) -> None:
    """Issue 10 item 4: `--new-run` into a folder holding someone's data/ is refused; nothing is deleted."""
    write_dataset(tmp_path / "in", files=1, rows_per_file=3)
    (tmp_path / "proj" / "data").mkdir(parents=True)
    (tmp_path / "proj" / "data" / "thesis.txt").write_text("x")
    job_b = write_job(tmp_path / "b.yaml", JOB_B)
    assert main(cli_args(tmp_path / "in", tmp_path / "proj", job_b, "--new-run")) == 2
    err = capsys.readouterr().err
    assert "is not empty (data)" in err and "holds no prefixflow run record" in err
    assert (tmp_path / "proj" / "data" / "thesis.txt").read_text() == "x"
    assert sorted(p.name for p in (tmp_path / "proj").iterdir()) == ["data"]  # not even a lease was written


def test_a_foreign_parquet_file_in_data_is_refused_not_read(tmp_path: Path, tiny_llm, capsys) -> None:
    """Issue 10 item 4: a Parquet file someone put into OUTPUT/data/ is named, never silently accepted."""
    ids, out = _setup(tmp_path, tiny_llm)
    some_part = next((out / "data").rglob("*.parquet"))
    shutil.copy(some_part, out / "data" / "extra.parquet")
    job_a = write_job(tmp_path / "a.yaml", JOB_A)
    assert main(cli_args(tmp_path / "in", out, job_a)) == 2
    assert "data/extra.parquet" in capsys.readouterr().err
    assert main(["status", str(out)]) == 0
    assert "extra.parquet" in capsys.readouterr().err
    (out / "data" / "extra.parquet").unlink()
    assert main(cli_args(tmp_path / "in", out, job_a)) == 0
    assert _committed(out).height == len(ids)
