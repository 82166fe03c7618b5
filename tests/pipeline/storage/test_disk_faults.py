"""Issue 22 item 4: the output disk full (ENOSPC) or read-only (EROFS) in the middle of a run.

finalize died with a traceback writing _manifest.json and no summary, and `.tmp-*` files stayed in the
root and in _metrics/ even after a successful resume. The fault is injected by a wrapper around
``os.fsync`` (every local write of prefixflow ends in one) that raises the OSError the kernel would,
for the temp files written in the output root once the run is under way (the manifest)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from prefixflow.pipeline.cli import main
from tests.pipeline.support import cli_args, job, write_dataset, write_job


@pytest.mark.parametrize("code", [errno.ENOSPC, pytest.param(errno.EROFS, marks=pytest.mark.slow)])
def test_a_full_or_read_only_disk_is_one_line_exit_1_and_the_resume_cleans_up(
    tmp_path: Path, capsys, monkeypatch: pytest.MonkeyPatch, code: int
) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=3, row_group_size=3)
    cfg = write_job(tmp_path / "job.yaml", job("generate", sampling={"max_tokens": 2}))
    out = tmp_path / "out"
    args = cli_args(tmp_path / "in", out, cfg)
    real_fsync = os.fsync

    def failing_fsync(fd: int) -> None:
        target = os.readlink(f"/proc/self/fd/{fd}")
        if os.path.dirname(target) == str(out) and (out / "_manifest.json").exists():
            raise OSError(code, os.strerror(code))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", failing_fsync)
    assert main(args) == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert "Traceback" not in err and len([line for line in lines if "error:" in line]) == 1
    flat = " ".join(err.split())
    assert os.strerror(code).lower().split()[0] in flat.lower() or "read-only" in flat
    assert "run the same command again to resume" in flat
    assert not list(out.rglob(".tmp-*"))  # the failed write removed its own temp file

    monkeypatch.setattr(os, "fsync", real_fsync)
    run_id = json.loads((out / "_prefixflow.json").read_text())["run_id"]
    strays = [
        out / ".tmp-killed",
        out / "_metrics" / run_id / "throughput" / ".tmp-killed",
        out / "_commits" / run_id / ".tmp-killed",
    ]
    for stray in strays:  # what a write killed mid-way (SIGKILL, power loss) leaves
        stray.parent.mkdir(parents=True, exist_ok=True)
        stray.write_bytes(b"partial")
    assert main(args) == 0
    assert not list(out.rglob(".tmp-*"))
    assert json.loads((out / "_manifest.json").read_text())["complete"] is True
