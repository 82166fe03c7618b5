"""Live progress of a run: rows done/total, rows/s, tok/s, prefix-cache hit rate and an ETA.

Two ways to show it, chosen by where stderr goes:
- a terminal: a bar redrawn at most every ``PREFIXFLOW_PROGRESS_REFRESH`` seconds (default 0.25);
- anything else (nohup, CI, Prefect logs): one plain line every ``log_every_s`` seconds
  (default ``PREFIXFLOW_PROGRESS_INTERVAL`` or 15 s), and one at the end.

Why the rates are computed here instead of by rich: rich's speed estimate only changes when the
counter advances, so a long scoring batch froze the ETA, and rows found already done at resume
counted as instant speed. Here rows found done count toward the total but not toward any rate, a
ticker samples the counters on a clock so a stall makes the rate decay (the ETA grows instead of
freezing), and an attached engine's counters (prompt tokens computed and output tokens sampled, both
counted per engine step) make the token count and tok/s move every step, not per finished row.

The ETA is the work left over its smoothed rate, counted in the tokens that take a job's time: output
tokens for a generating job (decode steps), computed prompt tokens for a scoring job (prefill). Work
left is the rows left times the tokens a finished row took on average, less what the engine already
did for rows still running. A slow start cannot blow it up: while 24 long generations decode and none
has finished, the rate is already the decode rate, and a row rate (rows finished / elapsed) near zero
plays no part. Without an engine's counters it falls back to rows left over the smoothed row rate;
before the first row finishes it is unknown ("?").
"""

from __future__ import annotations

import math
import os
import sys
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, TextIO

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn
from rich.text import Text

from prefixflow.pipeline.storage import slow

REFRESH_ENV = "PREFIXFLOW_PROGRESS_REFRESH"
INTERVAL_ENV = "PREFIXFLOW_PROGRESS_INTERVAL"
DEFAULT_LOG_EVERY_S = 15.0
SMOOTHING_S = 20.0  # time constant of the rate average: long enough to ride out batch boundaries
MODES = ("auto", "bar", "log", "off")


def _env_seconds(name: str, default: float) -> float:
    try:
        value = float(os.environ.get(name, default))
    except ValueError:
        return default
    return value if value >= 0 and math.isfinite(value) else default


class SmoothedRate:
    """Events per second, averaged exponentially over time (not over events).

    Until ``tau`` seconds have passed it is the plain average since the first sample, so a fresh
    run gets an estimate at once; after that each sample pulls the average toward the rate of its
    own interval with weight ``1 - exp(-dt / tau)``. A stretch without events therefore lowers the
    rate steadily, which is what keeps an ETA honest during a stall.
    """

    def __init__(self, tau: float = SMOOTHING_S) -> None:
        self.tau = tau
        self._t0: float | None = None
        self._v0 = 0.0
        self._last_t = 0.0
        self._last_v = 0.0
        self._rate: float | None = None

    def sample(self, now: float, value: float) -> None:
        if self._t0 is None:
            self._t0, self._v0, self._last_t, self._last_v = now, value, now, value
            return
        dt = now - self._last_t
        if dt <= 0:
            return
        since = now - self._t0
        if since <= self.tau:
            self._rate = (value - self._v0) / since
        else:
            inst = (value - self._last_v) / dt
            weight = 1.0 - math.exp(-dt / self.tau)
            self._rate = inst if self._rate is None else self._rate + weight * (inst - self._rate)
        self._last_t, self._last_v = now, value

    @property
    def rate(self) -> float | None:
        return self._rate


@dataclass(frozen=True)
class Snapshot:
    """What one progress line shows."""

    rows: int
    total: int
    rows_per_s: float | None
    tokens_per_s: float | None
    hit_rate: float | None
    elapsed_s: float
    eta_s: float | None
    tokens: int = 0  # tokens processed in this run (the engine's count when one is attached)

    def line(self) -> str:
        pct = f" ({self.rows / self.total:.0%})" if self.total else ""
        parts = [
            f"{self.rows:,}/{self.total:,} rows{pct}",
            rates_text(self),
            f"elapsed {clock_text(self.elapsed_s)}",
            f"ETA {clock_text(self.eta_s)}",
        ]
        return "  ".join(parts)


def rates_text(s: Snapshot) -> str:
    rows = "?" if s.rows_per_s is None else f"{s.rows_per_s:,.2f}"
    toks = "?" if s.tokens_per_s is None else f"{s.tokens_per_s:,.0f}"
    hit = "?" if s.hit_rate is None else f"{s.hit_rate:.0%}"
    return f"{rows} rows/s  {s.tokens:,} tokens  {toks} tok/s  prefix hit {hit}"


def clock_text(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}"


class ProgressDisplay:
    """Implements pipeline.run.shard_execution.ProgressSink; use as a context manager around the shard loop.

    ``mode``: ``auto`` (a bar on a terminal, log lines otherwise), ``bar``, ``log`` or ``off``.
    ``engine_stats``: a callable returning the engine's counters (``LLM.stats``); when given, tok/s
    counts the tokens the engine has processed, so it moves every engine step. ``emit`` replaces
    writing log lines to ``stream`` (flows pass their run logger). ``console`` draws the bar (and is
    where the stream defaults to), so other messages printed on it appear above the bar. ``clock`` is
    for tests.
    """

    def __init__(
        self,
        total_rows: int,
        *,
        mode: str = "auto",
        stream: TextIO | None = None,
        log_every_s: float | None = None,
        engine_stats: Callable[[], Any] | None = None,
        emit: Callable[[str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        console: Console | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"progress mode {mode!r}; allowed: {', '.join(MODES)}")
        self.stream = stream if stream is not None else console.file if console is not None else sys.stderr
        if mode == "auto":
            mode = "bar" if _isatty(self.stream) else "log"
        self.mode = mode
        self.total = total_rows
        self.rows = self.resumed_rows = 0
        self.prompt_tokens = self.cached_tokens = self.output_tokens = 0
        self.clock = clock
        self.log_every_s = (
            log_every_s if log_every_s is not None else _env_seconds(INTERVAL_ENV, DEFAULT_LOG_EVERY_S)
        )
        self.refresh_s = _env_seconds(REFRESH_ENV, 0.25)
        self.engine_stats = engine_stats
        self._engine_base = self._engine_raw()
        self.emit = emit or self._write_line
        self.start = clock()
        self._row_rate, self._token_rate = SmoothedRate(), SmoothedRate()
        self._gen_rate, self._prompt_rate = SmoothedRate(), SmoothedRate()  # the ETA's, from the engine
        self._last_draw = self._last_log = self.start
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._bar: Progress | None = None
        self.notice: str | None = None  # slow storage, while it lasts (storage/slow.py)
        self._watch: AbstractContextManager[None] | None = None
        if mode == "bar":
            self._bar = Progress(
                TextColumn("[bold]rows"),
                BarColumn(),
                MofNCompleteColumn(),
                TextColumn("{task.fields[info]}"),
                console=console or Console(file=self.stream),
                auto_refresh=False,
                transient=False,
            )
            self._task = self._bar.add_task("rows", total=total_rows, info="")

    # -- the ProgressSink side ------------------------------------------------------------------
    def advance(
        self, rows: int, prompt_tokens: int = 0, cached_tokens: int = 0, output_tokens: int = 0
    ) -> None:
        """``rows`` finished in this run, with their token counts."""
        with self._lock:
            self.rows += rows
            self.prompt_tokens += prompt_tokens
            self.cached_tokens += cached_tokens
            self.output_tokens += output_tokens
            if self._bar is not None and self.clock() - self._last_draw >= self.refresh_s:
                self._draw()

    def resumed(self, rows: int) -> None:
        """``rows`` found already done (committed or flushed by an earlier attempt): they count toward
        the total done but never toward a rate."""
        with self._lock:
            self.resumed_rows += rows
            if self._bar is not None:
                self._draw()

    def warn(self, message: str) -> None:
        """A warning about the rows (label collapse): printed above the bar, or as its own log line."""
        with self._lock:
            if self._bar is not None:
                self._bar.console.print(Text(f"warning: {message}", style="yellow"), soft_wrap=True)
                self._draw()
            else:
                self.emit(f"warning: {message}")

    def storage(self, text: str, still_slow: bool) -> None:
        """Slow storage (storage/slow.py): shown on the bar until it answers again, and as its own line
        (above the bar, or in the log)."""
        with self._lock:
            self.notice = text if still_slow else None
            if self._bar is not None:
                self._bar.console.print(Text(text, style="yellow" if still_slow else ""), soft_wrap=True)
                self._draw()
            else:
                self.emit(f"warning: {text}" if still_slow else text)

    # -- numbers ----------------------------------------------------------------------------------
    def _engine_counts(self) -> tuple[int, int] | None:
        """(prompt tokens computed, output tokens sampled) by the engine during this display."""
        if self.engine_stats is None or self._engine_base is None:
            return None
        now, base = self._engine_raw(), self._engine_base
        assert now is not None
        return now[0] - base[0], now[1] - base[1]

    def _engine_raw(self) -> tuple[int, int] | None:
        if self.engine_stats is None:
            return None
        stats = self.engine_stats()
        generated = getattr(stats, "generated_tokens", None)  # per step; output_tokens moves per finished row
        return int(stats.computed_prompt_tokens), int(
            generated if generated is not None else stats.output_tokens
        )

    def _tokens_done(self) -> int:
        engine = self._engine_counts()
        if engine is not None:
            return engine[0] + engine[1]
        return self.prompt_tokens - self.cached_tokens + self.output_tokens  # tokens actually computed

    def tick(self) -> None:
        """Sample the counters (the ticker thread calls this; tests call it with a fake clock), redraw
        the bar, and write a log line when one is due."""
        with self._lock:
            now = self.clock()
            self._row_rate.sample(now, self.rows)
            self._token_rate.sample(now, self._tokens_done())
            engine = self._engine_counts()
            if engine is not None:
                self._prompt_rate.sample(now, engine[0])
                self._gen_rate.sample(now, engine[1])
            if self._bar is not None:
                self._draw()
            elif self.mode == "log" and now - self._last_log >= self.log_every_s:
                self._last_log = now
                self.emit(self.snapshot().line() + ("  (storage slow)" if self.notice else ""))

    def snapshot(self) -> Snapshot:
        with self._lock:
            done = self.rows + self.resumed_rows
            rows_rate = self._row_rate.rate
            eta = self._eta(max(self.total - done, 0), rows_rate)
            hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else None
            elapsed = self.clock() - self.start
            return Snapshot(
                done, self.total, rows_rate, self._token_rate.rate, hit, elapsed, eta, self._tokens_done()
            )

    def _eta(self, rows_left: int, rows_rate: float | None) -> float | None:
        if rows_left == 0:
            return 0.0
        if self.rows == 0:
            return None  # no finished row yet: nothing says how much work a row is
        engine = self._engine_counts()
        if engine is not None:
            prompt_done, generated = engine
            # Decode steps dominate a generating job's time, prefill a scoring job's: count the kind of
            # token that rows of this job need (a prefill step computes far more tokens per second).
            if self.output_tokens > 0:
                rate, in_flight, per_row = (
                    self._gen_rate.rate,
                    generated - self.output_tokens,
                    self.output_tokens,
                )
            else:
                rate, in_flight = (
                    self._prompt_rate.rate,
                    prompt_done - (self.prompt_tokens - self.cached_tokens),
                )
                per_row = self.prompt_tokens - self.cached_tokens
            if rate is not None and rate > 0:
                return max(rows_left * per_row / self.rows - max(in_flight, 0), 0.0) / rate
        if rows_rate is not None and rows_rate > 0:
            return rows_left / rows_rate
        return None

    # -- drawing ----------------------------------------------------------------------------------
    def _draw(self) -> None:
        assert self._bar is not None
        s = self.snapshot()
        info = f"{rates_text(s)}  {clock_text(s.elapsed_s)}  ETA {clock_text(s.eta_s)}"
        if self.notice:
            info += f"  [yellow]{escape(self.notice)}[/]"
        self._bar.update(self._task, completed=s.rows, info=info)
        self._bar.refresh()
        self._last_draw = self.clock()

    def _write_line(self, text: str) -> None:
        print(f"prefixflow progress: {text}", file=self.stream, flush=True)

    def _run_ticker(self) -> None:
        period = min(self.refresh_s if self._bar is not None else self.log_every_s, 1.0) or 0.05
        while not self._stop.wait(period):
            self.tick()

    def __enter__(self) -> ProgressDisplay:
        if self.mode == "off":
            return self
        if self._bar is not None:
            self._bar.start()
        self._watch = slow.watch(self.storage)
        self._watch.__enter__()  # left in __exit__
        self.tick()
        self._thread = threading.Thread(target=self._run_ticker, name="prefixflow-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.mode == "off":
            return
        if self._watch is not None:
            self._watch.__exit__(None, None, None)
            self._watch = None
        self.tick()
        if self._bar is not None:
            self._bar.stop()
        elif self.mode == "log":
            self.emit(self.snapshot().line())


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
