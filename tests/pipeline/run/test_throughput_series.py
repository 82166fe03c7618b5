"""Throughput over time: per-lane intervals (stalls kept as zeros), stored and read back, merged on one
clock, drawn as a sparkline and an SVG (and a PNG where matplotlib is installed)."""

from __future__ import annotations

import importlib.util
import xml.etree.ElementTree as ET
from pathlib import Path

from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.report.charts import png_chart, sparkline, svg_chart
from prefixflow.pipeline.run.throughput_series import (
    LaneSeries,
    ThroughputRecorder,
    load_series,
    run_timeline,
    saver,
    summary_of,
)
from prefixflow.pipeline.storage.layout import Layout
from prefixflow.pipeline.storage.store import Store


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def _record(lane: str, start: float, pattern: list[int], save=None) -> ThroughputRecorder:
    """One row of 100 prompt / 10 output tokens per entry of ``pattern`` per 5 s interval."""
    clock = Clock(start)
    rec = ThroughputRecorder(lane, save=save, interval_s=5.0, save_every_s=1e9, clock=clock)
    for k, rows in enumerate(pattern):
        clock.now = start + 5 * k + 1
        for _ in range(rows):
            rec.advance(1, prompt_tokens=100, cached_tokens=40, output_tokens=10)
    clock.now = start + 5 * (len(pattern) - 1) + 2.5  # the run ends half-way through the last interval
    rec.flush()
    return rec


def test_intervals_keep_stalls_and_the_last_partial_interval(tmp_path: Path) -> None:
    saved: list[bytes] = []
    rec = _record("lane-0", 1000.0, [3, 0, 0, 2], save=lambda s: saved.append(s.to_json()))
    series = LaneSeries.from_json(saved[-1])
    assert [i.rows for i in series.intervals] == [3, 0, 0, 2]  # the stall shows as zeros
    assert [i.seconds for i in series.intervals] == [5.0, 5.0, 5.0, 2.5]
    assert (
        series.intervals[0].tokens_per_s == 3 * 110 / 5 and series.intervals[3].tokens_per_s == 2 * 110 / 2.5
    )
    assert series.totals() == {
        "rows": 5,
        "prompt_tokens": 500,
        "cached_tokens": 200,
        "output_tokens": 50,
        "computed_tokens": 0,
        "generated_tokens": 0,
    }
    rec.resumed(100)  # rows of an earlier attempt are not this lane's throughput
    assert sum(i.rows for i in rec.series.intervals) == 5


def test_series_are_stored_beside_the_run_and_merged_on_one_clock(tmp_path: Path) -> None:
    layout = Layout(Store.open(str(tmp_path / "out"), StorageConfig())).for_run("run1")
    _record("lane-0", 1000.0, [2, 2, 2], save=saver(layout))
    _record("lane-1", 1005.0, [4, 0], save=saver(layout))  # started one interval later
    (tmp_path / "out" / "_metrics" / "run1" / "throughput" / "junk.json").write_text("{not json")
    series = load_series(layout)
    assert [s.lane for s in series] == ["lane-0", "lane-1"]
    timeline = run_timeline(series)
    assert [i.rows for i in timeline] == [2, 6, 2]
    lanes = summary_of(series)["lanes"]
    assert lanes[1]["rows"] == 4 and lanes[1]["idle_intervals"] == 1 and lanes[0]["peak_tokens_per_s"] > 0


def test_sparkline_and_svg_chart() -> None:
    assert (
        sparkline([0, 5, 10]) == "▁▅█"
        and sparkline([0, 0]) == "▁▁"
        and len(sparkline(list(range(300)), 60)) == 60
    )
    series = [_record("lane-0", 1000.0, [2, 2, 0, 2]).series, _record("lane-1", 1005.0, [4, 1]).series]
    svg = svg_chart(series)
    root = ET.fromstring(svg)  # well-formed
    ns = "{http://www.w3.org/2000/svg}"
    lines = root.findall(f"{ns}polyline")
    assert len(lines) == 3  # two lanes and their sum
    assert [len(p.get("points", "").split()) for p in lines[:2]] == [4, 2]
    labels = [t.text for t in root.iter(f"{ns}text")]
    assert "lane-0" in labels and "all lanes" in labels


def test_png_chart_when_matplotlib_is_installed() -> None:
    series = [_record("lane-0", 1000.0, [1, 2]).series]
    png = png_chart(series)
    if importlib.util.find_spec("matplotlib") is None:
        assert png is None  # the optional extra is missing: no PNG, the SVG still exists
    else:
        assert png is not None and png.startswith(b"\x89PNG")


class _Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def test_intervals_count_tokens_per_engine_step_not_when_rows_finish() -> None:
    """24 rows decode for 200 s and finish together: every interval shows the decode rate; counted
    only at row finishes, 195 s read 0 tok/s and the last interval a spike."""
    from types import SimpleNamespace

    from prefixflow.pipeline.run.throughput_series import ThroughputRecorder

    clock = _Clock()
    stats = SimpleNamespace(computed_prompt_tokens=0, generated_tokens=0)
    llm = SimpleNamespace(
        stats=lambda: stats, add_step_listener=lambda fn: listeners.append(fn) or (lambda: None)
    )
    listeners: list = []
    recorder = ThroughputRecorder("lane-0", clock=clock, interval_s=5.0)
    recorder.attach(llm)
    stats.computed_prompt_tokens = 1200
    listeners[0](stats)
    for _ in range(200):
        clock.now += 1
        stats.generated_tokens += 24
        listeners[0](stats)
    recorder.advance(24, prompt_tokens=1200, output_tokens=4800)
    recorder.flush()
    intervals = recorder.series.intervals
    assert len(intervals) >= 40
    assert all(i.tokens_per_s > 0 for i in intervals[:-1])
    assert all(abs(i.output_tokens_per_s - 24) < 1e-9 for i in intervals[1:-1])
    totals = recorder.series.totals()
    assert totals["generated_tokens"] == 4800 and totals["computed_tokens"] == 1200
    assert recorder.series.from_json(recorder.series.to_json()).totals() == totals


def test_a_real_engine_reports_its_steps_to_the_series(tmp_path) -> None:
    from prefixflow.engine import LLM, SamplingParams
    from prefixflow.pipeline.run.throughput_series import ThroughputRecorder

    llm = LLM("tiny", max_model_len=128)
    recorder = ThroughputRecorder("lane-0")
    detach = recorder.attach(llm)
    outs = llm.generate(["one", "two", "three"], SamplingParams(max_tokens=7, ignore_eos=True))
    detach()
    llm.generate(["after detach"], SamplingParams(max_tokens=3, ignore_eos=True))
    totals = recorder.series.totals()
    assert totals["generated_tokens"] == sum(o.num_output_tokens for o in outs) == 21
    assert totals["computed_tokens"] == sum(o.num_prompt_tokens - o.num_cached_tokens for o in outs)
