"""SIGTERM and Ctrl-C end `prefixflow run` with one line saying how to resume, exit 128 + signal, and
leave nothing that blocks the next run (issue 10, item 8)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from prefixflow.pipeline.cli import main
from tests.pipeline.support import cli_args, job, start_cli, wait_for_hook, write_dataset, write_job


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGTERM, 143), pytest.param(signal.SIGINT, 130, marks=pytest.mark.slow)]
)
def test_interrupt_says_how_to_resume_and_the_rerun_completes(tmp_path: Path, sig: int, code: int) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=6, row_group_size=3)
    job_file = write_job(tmp_path / "job.yaml", job("generate", output={"shard_rows": 3, "flush_rows": 2}))
    args = cli_args(tmp_path / "in", tmp_path / "out", job_file)
    proc = start_cli(args, hooks="flush_begin", hook_sleep=30)
    try:
        wait_for_hook(proc, "flush_begin")
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    assert proc.returncode == code, err
    assert "interrupted; re-run the same command to resume" in err and "Traceback" not in err
    assert not list((tmp_path / "out" / "_leases").glob("*.json"))  # the lease was given back
    assert main(args) == 0
