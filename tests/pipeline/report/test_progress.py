"""The progress display's numbers (rows/s, tok/s, hit rate, a smoothed ETA) and its two faces: a bar on a
terminal, a periodic plain line everywhere else. A fake clock drives it, so nothing here is timed."""

from __future__ import annotations

import io
from types import SimpleNamespace

from rich.console import Console

from prefixflow.pipeline.report.progress import ProgressDisplay, SmoothedRate, clock_text


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_smoothed_rate_averages_then_decays_during_a_stall() -> None:
    rate = SmoothedRate(tau=10.0)
    rate.sample(0.0, 0)
    assert rate.rate is None  # one sample says nothing yet
    rate.sample(5.0, 50)
    assert rate.rate == 10.0  # plain average while younger than tau
    rate.sample(10.0, 100)
    before = rate.rate
    for t in range(11, 30):  # nothing finishes for 20 s
        rate.sample(float(t), 100)
    assert before is not None and rate.rate is not None
    assert 0 < rate.rate < before / 2  # the stall shows, but the estimate does not drop to zero at once


def test_resumed_rows_count_as_done_but_not_as_speed() -> None:
    clock = FakeClock()
    display = ProgressDisplay(100, mode="log", stream=io.StringIO(), clock=clock)
    display.tick()
    display.resumed(60)  # found committed by an earlier run: must not make the run look fast
    clock.now += 2
    display.tick()
    snap = display.snapshot()
    assert snap.rows == 60 and snap.rows_per_s == 0.0 and snap.eta_s is None
    display.advance(4, prompt_tokens=400, cached_tokens=100, output_tokens=40)
    clock.now += 2
    display.tick()
    snap = display.snapshot()
    assert snap.rows == 64 and snap.rows_per_s == 1.0  # 4 rows over 4 s of this run
    assert snap.eta_s == 36.0 and snap.hit_rate == 0.25


def test_eta_grows_during_a_stall_instead_of_freezing() -> None:
    clock = FakeClock()
    display = ProgressDisplay(1000, mode="log", stream=io.StringIO(), clock=clock)
    display.tick()
    for _ in range(30):  # steady 2 rows/s for 30 s
        clock.now += 1
        display.advance(2)
        display.tick()
    steady = display.snapshot().eta_s
    etas = []
    for _ in range(3):  # then a long scoring batch: nothing finishes
        clock.now += 10
        display.tick()
        etas.append(display.snapshot().eta_s)
    assert steady is not None and all(e is not None for e in etas)
    assert steady < etas[0] < etas[1] < etas[2]


def test_tokens_per_second_follow_the_engine_between_finished_rows() -> None:
    clock = FakeClock()
    stats = SimpleNamespace(computed_prompt_tokens=500, output_tokens=0)  # counted before the display
    display = ProgressDisplay(10, mode="log", stream=io.StringIO(), engine_stats=lambda: stats, clock=clock)
    display.tick()
    for _ in range(4):  # engine steps process prompt tokens; no row has finished yet
        clock.now += 1
        stats.computed_prompt_tokens += 300
        display.tick()
    snap = display.snapshot()
    assert snap.rows == 0 and snap.tokens_per_s == 300.0


def test_log_mode_writes_a_plain_line_every_interval() -> None:
    clock = FakeClock()
    out = io.StringIO()  # not a terminal: no bar, no escape codes
    with ProgressDisplay(50, stream=out, log_every_s=15, clock=clock) as display:
        assert display.mode == "log"
        display._stop.set()  # drive ticks by hand
        clock.now += 5
        display.advance(10, prompt_tokens=1000, cached_tokens=700, output_tokens=100)
        display.tick()
        assert out.getvalue() == ""  # not due yet
        clock.now += 11
        display.tick()
        first = out.getvalue().splitlines()
        assert len(first) == 1
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # plus the closing line
    assert lines[0].startswith("prefixflow progress: 10/50 rows (20%)")
    assert "rows/s" in lines[0] and "tok/s" in lines[0] and "prefix hit 70%" in lines[0]
    assert "ETA 0:01:04" in lines[0]  # 40 rows left at 10 rows / 16 s
    assert "\x1b" not in out.getvalue()


def test_bar_mode_draws_rows_rates_and_eta_on_a_terminal() -> None:
    clock = FakeClock()
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=160)
    with ProgressDisplay(10, mode="bar", console=console, clock=clock) as bar:
        bar._stop.set()
        clock.now += 2
        bar.advance(5, prompt_tokens=100, cached_tokens=25, output_tokens=10)
        bar.tick()
    text = out.getvalue()
    assert "5/10" in text and "prefix hit 25%" in text and "ETA 0:00:02" in text


def test_clock_text() -> None:
    assert clock_text(None) == "?" and clock_text(3725.4) == "1:02:05" and clock_text(float("inf")) == "?"


def test_eta_holds_while_a_batch_of_long_generations_decodes() -> None:
    """The issue's run: 24 rows decode together for minutes and none finishes. Tokens must count per
    engine step (tok/s is the decode rate, not 0), and the ETA must stay near the truth instead of
    climbing towards 1,620 hours. Two batches of 24 rows, each row 50 prompt + 400 output tokens, the
    engine sampling 24 tokens a second (one per running row); the truth is known at every tick."""
    clock = FakeClock()
    stats = SimpleNamespace(computed_prompt_tokens=0, output_tokens=0, generated_tokens=0)
    display = ProgressDisplay(48, mode="log", stream=io.StringIO(), engine_stats=lambda: stats, clock=clock)
    display.tick()
    start = clock.now
    errors = []
    for batch in range(2):
        stats.computed_prompt_tokens += 24 * 50  # one prefill step
        for second in range(400):
            clock.now += 1
            stats.generated_tokens += 24
            if second == 399:
                stats.output_tokens += 24 * 400
                display.advance(24, prompt_tokens=24 * 50, output_tokens=24 * 400)
            display.tick()
            snap = display.snapshot()
            assert snap.tokens >= stats.generated_tokens  # moves every step
            if batch == 0 and second < 399:
                assert snap.rows == 0 and snap.eta_s is None  # nothing says yet how long a row is
            true_left = 800 - (clock.now - start)
            if snap.eta_s is not None and true_left > 0:
                errors.append(abs(snap.eta_s - true_left) / true_left)
        assert display.snapshot().tokens_per_s is not None and display.snapshot().tokens_per_s > 20
    assert errors and max(errors) < 0.25, max(errors)
    assert display.snapshot().eta_s == 0.0
