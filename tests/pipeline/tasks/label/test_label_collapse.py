"""The label-collapse warning (issue 14): one label taking nearly every row of a job that lists
several is reported with its share in the progress output, the run summary and `status`."""

from __future__ import annotations

import io
from pathlib import Path

import pytest
from rich.console import Console

from prefixflow.pipeline import load_job, status
from prefixflow.pipeline.local_run import print_summary, run_local
from prefixflow.pipeline.tasks.label.watch import MIN_ROWS, LabelWatch, collapse_warning
from tests.pipeline.support import job, write_parquet

# With calibration off, a one-token label beats a six-token one on every row of the random tiny model:
# a dependable collapse.
COLLAPSING = {"labels": ["yes", "yes yes yes yes yes yes"], "calibration": "none", "case_variants": False}


def test_collapse_warning_thresholds() -> None:
    assert collapse_warning({"a": 81, "b": 19}, 4, "x") is not None
    assert collapse_warning({"a": 80, "b": 20}, 4, "x") is None  # exactly 80 % is not "more than"
    assert collapse_warning({"a": MIN_ROWS - 1}, 4, "x") is None  # too few rows to say
    assert collapse_warning({"a": 100}, 1, "x") is None  # a one-label job cannot collapse
    message = collapse_warning({"billing": 97, "shipping": 3}, 4, "the first 100 labeled rows")
    assert message is not None
    assert "'billing' is 97% of the first 100 labeled rows (97 of 100)" in message
    assert "lists 4 labels" in message and "label.calibration" in message


def test_watch_warns_once_after_its_window_and_finish_checks_short_runs() -> None:
    warnings: list[str] = []
    watch = LabelWatch(3, warnings.append, window=30)
    for i in range(100):
        watch.observe({"label": "a" if i % 10 else "b"})  # 90 % "a"
        watch.observe({"label": None})  # error rows do not count
    watch.finish()
    assert len(warnings) == 1 and "'a' is 90% of the first 30 labeled rows (27 of 30)" in warnings[0]

    short: list[str] = []
    small = LabelWatch(3, short.append, window=200)
    for _ in range(25):
        small.observe({"label": "a"})
    assert short == []
    small.finish()
    assert len(short) == 1 and "100% of the 25 labeled rows of this run" in short[0]

    balanced: list[str] = []
    fine = LabelWatch(3, balanced.append, window=30)
    for i in range(60):
        fine.observe({"label": "abc"[i % 3]})
    fine.finish()
    assert balanced == [] and fine.checked


@pytest.mark.parametrize("rows", [30])
def test_a_collapsed_label_job_is_reported_everywhere(tmp_path: Path, tiny_llm, rows: int) -> None:
    write_parquet(
        tmp_path / "in" / "rows.parquet", [{"id": f"r{i}", "text": f"row {i} text"} for i in range(rows)]
    )
    cfg = job("label", chat="off", label=COLLAPSING, output={"shard_rows": 10})
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    stream = io.StringIO()
    console = Console(file=stream, width=400)
    summary, failures = run_local(spec, llm=tiny_llm, progress=False, console=console)
    assert failures == [] and summary.complete
    # progress output: the live check, once, over the run's 30 rows (3 shards of 10)
    live = [line for line in stream.getvalue().splitlines() if "label collapse" in line]
    assert len(live) == 1 and "'yes' is 100% of the 30 labeled rows of this run (30 of 30)" in live[0]
    # run summary, from the commit markers
    assert summary.label_counts == {"yes": rows}
    assert summary.label_warning and "'yes' is 100% of the committed labeled rows" in summary.label_warning
    print_summary(console, summary)
    assert "yes 100% (30)" in stream.getvalue() and stream.getvalue().count("label collapse") == 2
    # status reads the same from the output root alone
    again, _ = status(str(tmp_path / "out"))
    assert again.label_counts == {"yes": rows} and again.label_warning == summary.label_warning


def test_a_generate_job_has_no_label_counts(tmp_path: Path, tiny_llm) -> None:
    write_parquet(tmp_path / "in" / "rows.parquet", [{"id": f"r{i}", "text": f"row {i}"} for i in range(3)])
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", job("generate"))
    summary, _ = run_local(spec, llm=tiny_llm, progress=False)
    assert summary.label_counts == {} and summary.label_warning is None


@pytest.mark.parametrize("mode", ["bar", "log", "off"])
def test_progress_display_shows_warnings_in_every_mode(mode: str) -> None:
    from prefixflow.pipeline.report.progress import ProgressDisplay

    stream = io.StringIO()
    console = Console(file=stream, force_terminal=mode == "bar", width=200)
    with ProgressDisplay(10, mode=mode, console=console, log_every_s=3600) as display:
        display.advance(3)
        display.warn("label collapse: 'a' is 90% of [the first 200] labeled rows")
    assert "warning: label collapse: 'a' is 90% of [the first 200] labeled rows" in stream.getvalue()
