"""The progress display as a user sees it: `prefixflow run` in a real pseudo-terminal (the bar, redrawn as
rows finish), and with stderr going to a file (plain progress lines, no escape codes)."""

from __future__ import annotations

import os
import pty
import re
import select
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.pipeline.support import ENGINE, job, write_dataset

REPO = Path(__file__).resolve().parents[3]
ROWS = 24


def _run_in_pty(argv: list[str], env: dict[str, str], timeout: float = 300) -> tuple[int, str]:
    """Run with stdin/stdout/stderr on a pty (a terminal to the program) and capture everything it drew."""
    master, slave = pty.openpty()
    proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, cwd=REPO, env=env, close_fds=True)
    os.close(slave)
    chunks: list[bytes] = []
    try:
        while True:
            ready, _, _ = select.select([master], [], [], timeout)
            if not ready:
                proc.kill()
                raise AssertionError(
                    "no output for too long: " + b"".join(chunks).decode(errors="replace")[-2000:]
                )
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the program closed the terminal
                break
            if not data:
                break
            chunks.append(data)
    finally:
        os.close(master)
    return proc.wait(timeout=60), b"".join(chunks).decode("utf-8", errors="replace")


def _job_file(tmp_path: Path, task: str, flush_rows: int) -> Path:
    cfg = job(
        task, output={"shard_rows": ROWS, "flush_rows": flush_rows}, engine={**ENGINE, "max_num_seqs": 2}
    )
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def _argv(tmp_path: Path, job_file: Path, out: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "prefixflow.pipeline.cli",
        "run",
        "--input",
        str(tmp_path / "in"),
        "--output",
        str(tmp_path / out),
        "--model",
        "tiny",
        "--job",
        str(job_file),
    ]


def test_the_bar_counts_rows_as_they_finish_in_a_terminal(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=ROWS, row_group_size=ROWS)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
        "TERM": "xterm",
        "PREFIXFLOW_PROGRESS_REFRESH": "0",
    }
    code, screen = _run_in_pty(_argv(tmp_path, _job_file(tmp_path, "generate", flush_rows=ROWS), "out"), env)
    assert code == 0, screen[-3000:]
    assert "\x1b[" in screen  # drawn as a live bar (cursor control), not as log lines
    counts = [int(m.group(1)) for m in re.finditer(rf"(\d+)/{ROWS}\b", screen)]
    assert counts and counts[-1] == ROWS
    # the counter moved row by row while the one and only flush batch was still being generated
    assert len({c for c in counts if 0 < c < ROWS}) >= ROWS // 2, counts
    assert counts == sorted(counts)
    assert re.search(r"rows/s .* tok/s .* prefix hit \d+%", screen) and "ETA" in screen


def test_without_a_terminal_progress_is_plain_lines(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=ROWS, row_group_size=ROWS)
    env = {**os.environ, "PYTHONPATH": str(REPO), "PREFIXFLOW_PROGRESS_INTERVAL": "0.2"}
    res = subprocess.run(
        _argv(tmp_path, _job_file(tmp_path, "generate", flush_rows=8), "out"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("prefixflow progress: ")]
    assert lines and "\x1b" not in res.stderr
    assert lines[-1].startswith(f"prefixflow progress: {ROWS}/{ROWS} rows (100%)")
    assert all(re.search(r"rows/s .* tok/s .* prefix hit .* ETA", ln) for ln in lines)


def test_label_rows_count_up_before_the_scoring_batch_finishes(tmp_path: Path) -> None:
    """The issue's case: label mode sat at 0/N until a whole scoring batch finished. Here the whole
    shard is one scoring batch (flush_rows = rows); rows must be counted while the engine is still
    scoring the batch: some frame shows 0 < k < N rows next to fewer processed tokens than the
    batch needs in all (if rows only arrived after the batch, every such frame would show the final
    token count). Only the order of events decides this, not timing."""
    write_dataset(tmp_path / "in", files=1, rows_per_file=ROWS, row_group_size=ROWS)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
        "TERM": "xterm",
        "PREFIXFLOW_PROGRESS_REFRESH": "0",
    }
    code, screen = _run_in_pty(_argv(tmp_path, _job_file(tmp_path, "label", flush_rows=ROWS), "out"), env)
    assert code == 0, screen[-3000:]
    frames = [
        (int(m.group(1)), int(m.group(2).replace(",", "")))
        for m in re.finditer(rf"(\d+)/{ROWS}\b[^\r\n]*?([\d,]+) tokens", screen)
    ]
    assert frames and frames[-1][0] == ROWS
    final_tokens = frames[-1][1]
    early = {rows for rows, tokens in frames if 0 < rows < ROWS and tokens < final_tokens}
    assert len(early) >= ROWS // 2, frames


@pytest.mark.slow  # a subprocess in a pty decoding 24 x 120 tokens, about 5 s here
def test_tokens_count_per_engine_step_before_any_row_finishes(tmp_path: Path) -> None:
    """The issue's case: every row decodes at once and none finishes for a long while. The bar must
    show the token count climbing (and a tok/s above 0) while it still reads 0/N rows; counted only
    when rows finish, it stayed at the prompt tokens. Only the order of events decides this."""
    write_dataset(tmp_path / "in", files=1, rows_per_file=ROWS, row_group_size=ROWS)
    cfg = job(
        "generate",
        output={"shard_rows": ROWS, "flush_rows": ROWS},
        engine={**ENGINE, "max_num_seqs": 32, "max_model_len": 256},
        sampling={"max_tokens": 120, "ignore_eos": True},
    )
    job_file = tmp_path / "job.yaml"
    job_file.write_text(yaml.safe_dump(cfg))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COLUMNS": "200",
        "TERM": "xterm",
        # a frame every 2 ms: the tiny model's 120 decode steps take well under a second, and the
        # default ticker (50 ms with refresh 0) drew no frame between prefill and the last step on a fast
        # host (a fresh-clone CI run, after the row attention kernel got faster)
        "PREFIXFLOW_PROGRESS_REFRESH": "0.002",
    }
    code, screen = _run_in_pty(_argv(tmp_path, job_file, "out"), env)
    assert code == 0, screen[-3000:]
    frames = [
        (int(m.group(1)), int(m.group(2).replace(",", "")), m.group(3))
        for m in re.finditer(rf"(\d+)/{ROWS}\b[^\r\n]*?([\d,]+) tokens\s+([\d,?]+) tok/s", screen)
    ]
    assert frames and frames[-1][0] == ROWS
    before_any_row = [(tokens, rate) for rows, tokens, rate in frames if rows == 0]
    assert len({tokens for tokens, _ in before_any_row}) >= 3, (
        before_any_row
    )  # prefill, then every decode step
    assert any(rate not in ("?", "0") for _, rate in before_any_row), before_any_row
