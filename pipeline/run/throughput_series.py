"""Throughput over time, per lane: rows and tokens per fixed interval, stored beside the run record.

Totals hide stalls and tail effects (one lane idle while another finishes its last shard, a long
scoring batch, a slow S3 write); a series of small intervals shows them. Each lane attempt records
its own series and rewrites it whole every ``save_every_s`` seconds and at the end (one PUT on S3, a
rename locally), under ``OUTPUT/_metrics/<run id>/throughput/<lane>-<attempt>.json``. Intervals with nothing
finished are kept as zeros: they are the stalls.

With an engine that reports its steps (``LLM.add_step_listener``), each interval also holds the tokens
the engine computed in it, counted per step (``computed_tokens``: prompt tokens computed;
``generated_tokens``: output tokens sampled), and its tok/s is those: a batch of long generations
shows its steady decode rate instead of zeros and a spike when the rows finish together.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from prefixflow.pipeline.storage.layout import Layout

DEFAULT_INTERVAL_S = 5.0
SAVE_EVERY_S = 30.0
FIELDS = ("rows", "prompt_tokens", "cached_tokens", "output_tokens", "computed_tokens", "generated_tokens")


@dataclass
class Interval:
    """What finished during ``[start_s, start_s + seconds)`` after the series began."""

    start_s: float
    seconds: float
    rows: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    output_tokens: int = 0
    computed_tokens: int = 0  # engine steps in this interval: prompt tokens computed
    generated_tokens: int = 0  # engine steps in this interval: output tokens sampled

    @property
    def stepped(self) -> bool:
        return bool(self.computed_tokens or self.generated_tokens)

    @property
    def tokens_per_s(self) -> float:
        """Tokens the engine computed per second, from its per-step counts; for a series recorded
        without them, prompt plus output tokens of the rows finished in the interval."""
        if self.seconds <= 0:
            return 0.0
        if self.stepped:
            return (self.computed_tokens + self.generated_tokens) / self.seconds
        return (self.prompt_tokens + self.output_tokens) / self.seconds

    @property
    def output_tokens_per_s(self) -> float:
        if self.seconds <= 0:
            return 0.0
        return (self.generated_tokens if self.stepped else self.output_tokens) / self.seconds

    def as_list(self) -> list[float | int]:
        return [round(self.start_s, 3), round(self.seconds, 3), *(getattr(self, f) for f in FIELDS)]


@dataclass
class LaneSeries:
    """One lane attempt's intervals. ``started_at`` is wall-clock (epoch seconds), so lanes line up."""

    lane: str
    attempt: str
    started_at: float
    interval_s: float
    intervals: list[Interval] = field(default_factory=list)
    devices: int = 1  # devices the lane held (GPUs, or 1 for a CPU lane): device-seconds = devices x time

    @property
    def seconds(self) -> float:
        return sum(i.seconds for i in self.intervals)

    @property
    def device_seconds(self) -> float:
        return self.devices * self.seconds

    def to_json(self) -> bytes:
        doc = {
            "version": 1,
            "lane": self.lane,
            "attempt": self.attempt,
            "started_at": self.started_at,
            "interval_s": self.interval_s,
            "devices": self.devices,
            "columns": ["start_s", "seconds", *FIELDS],
            "intervals": [i.as_list() for i in self.intervals],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @classmethod
    def from_json(cls, data: bytes) -> LaneSeries:
        doc = json.loads(data)
        rows = [Interval(float(r[0]), float(r[1]), *(int(v) for v in r[2:])) for r in doc["intervals"]]
        return cls(
            str(doc["lane"]),
            str(doc["attempt"]),
            float(doc["started_at"]),
            float(doc["interval_s"]),
            rows,
            int(doc.get("devices", 1)),
        )

    def totals(self) -> dict[str, int]:
        return {f: sum(getattr(i, f) for i in self.intervals) for f in FIELDS}


class ThroughputRecorder:
    """A ProgressSink that bins finished rows into fixed intervals and saves the series now and then.

    ``save`` receives the serialized series (the caller decides where it goes); ``clock`` returns
    wall-clock seconds (tests pass a fake one)."""

    def __init__(
        self,
        lane: str,
        save: Callable[[LaneSeries], None] | None = None,
        interval_s: float = DEFAULT_INTERVAL_S,
        save_every_s: float = SAVE_EVERY_S,
        clock: Callable[[], float] = time.time,
        devices: int = 1,
    ) -> None:
        self.clock = clock
        now = clock()
        attempt = f"{int(now * 1000):013x}-{uuid.uuid4().hex[:6]}"
        self.series = LaneSeries(lane, attempt, now, interval_s, devices=devices)
        self._save = save
        self.save_every_s = save_every_s
        self._last_save = now
        self._engine_seen: tuple[int, int] | None = None

    def on_step(self, stats: Any) -> None:
        """An engine step finished (``LLM.add_step_listener``): bin the tokens it computed now."""
        seen = (int(stats.computed_prompt_tokens), int(stats.generated_tokens))
        before, self._engine_seen = self._engine_seen, seen
        if before is None:  # not attached: no baseline, so this step's counts cannot be told apart
            before = seen
        now = self.clock()
        current = self._current(now)
        current.computed_tokens += seen[0] - before[0]
        current.generated_tokens += seen[1] - before[1]
        if self._save is not None and now - self._last_save >= self.save_every_s:
            self.flush(now)

    def attach(self, llm: Any) -> Callable[[], None]:
        """Listen to ``llm``'s steps when it offers them; returns the detach function."""
        add = getattr(llm, "add_step_listener", None)
        if add is None:
            return lambda: None
        stats = getattr(llm, "stats", None)
        if callable(stats):
            current = stats()
            self._engine_seen = (int(current.computed_prompt_tokens), int(current.generated_tokens))
        detach: Callable[[], None] = add(self.on_step)
        return detach

    def _current(self, now: float) -> Interval:
        """The interval ``now`` falls in, opening empty ones for any gap (stalls stay visible)."""
        s = self.series
        elapsed = max(now - s.started_at, 0.0)
        index = int(elapsed // s.interval_s)
        while len(s.intervals) <= index:
            s.intervals.append(Interval(len(s.intervals) * s.interval_s, s.interval_s))
        return s.intervals[index]

    def advance(
        self, rows: int, prompt_tokens: int = 0, cached_tokens: int = 0, output_tokens: int = 0
    ) -> None:
        now = self.clock()
        current = self._current(now)
        current.rows += rows
        current.prompt_tokens += prompt_tokens
        current.cached_tokens += cached_tokens
        current.output_tokens += output_tokens
        if self._save is not None and now - self._last_save >= self.save_every_s:
            self.flush(now)

    def resumed(self, rows: int) -> None:
        """Rows an earlier attempt finished are not this lane's throughput."""

    def flush(self, now: float | None = None) -> None:
        """Save the series, with its last interval cut at ``now`` (so a partial interval's rate is right)."""
        now = self.clock() if now is None else now
        self._last_save = now
        s = self.series
        if s.intervals:
            self._current(now)
            last = s.intervals[-1]
            last.seconds = max(min(s.interval_s, now - s.started_at - last.start_s), 1e-3)
        if self._save is not None:
            try:
                self._save(s)
            except Exception as exc:  # a report must never fail the run (e.g. an S3 hiccup)
                logging.getLogger("prefixflow").warning("throughput series not saved: %s", exc)
        if s.intervals:
            s.intervals[-1].seconds = s.interval_s  # the interval keeps filling after a mid-way save


def saver(layout: Layout) -> Callable[[LaneSeries], None]:
    """Write a lane's series under the output root (a lane attempt owns its file; rewritten whole)."""

    def save(series: LaneSeries) -> None:
        layout.store.write_atomic(layout.throughput(f"{series.lane}-{series.attempt}.json"), series.to_json())

    return save


def load_series(layout: Layout) -> list[LaneSeries]:
    """Every lane attempt's series under the output root, oldest first; unreadable files are skipped
    (a series is a report, never a reason to fail)."""
    if not layout.run_id:
        return []
    out = []
    for path in layout.store.list_files(layout.throughput()):
        if not path.endswith(".json"):
            continue
        try:
            out.append(LaneSeries.from_json(layout.store.read_bytes(path)))
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
    return sorted(out, key=lambda s: (s.started_at, s.lane))


def run_timeline(series: list[LaneSeries], interval_s: float | None = None) -> list[Interval]:
    """All lanes added up on one wall-clock axis (from the first lane's start), in ``interval_s`` bins."""
    if not series:
        return []
    step = interval_s or max(s.interval_s for s in series)
    t0 = min(s.started_at for s in series)
    bins: dict[int, Interval] = {}
    for s in series:
        for i in s.intervals:
            index = int((s.started_at - t0 + i.start_s) // step)
            b = bins.setdefault(index, Interval(index * step, step))
            for f in FIELDS:
                setattr(b, f, getattr(b, f) + getattr(i, f))
    last = max(bins)
    return [bins.get(k, Interval(k * step, step)) for k in range(last + 1)]


def summary_of(series: list[LaneSeries]) -> dict[str, Any]:
    """Per lane: totals, active seconds, peak and median tok/s (what `status` and the artifact show)."""
    lanes = []
    for s in series:
        rates = sorted(i.tokens_per_s for i in s.intervals)
        lanes.append(
            {
                "lane": s.lane,
                "attempt": s.attempt,
                "started_at": s.started_at,
                **s.totals(),
                "seconds": round(s.seconds, 3),
                "devices": s.devices,
                "device_seconds": round(s.device_seconds, 3),
                "peak_tokens_per_s": round(rates[-1], 2) if rates else 0.0,
                "median_tokens_per_s": round(rates[len(rates) // 2], 2) if rates else 0.0,
                "idle_intervals": sum(1 for i in s.intervals if i.rows == 0 and not i.stepped),
            }
        )
    return {"lanes": lanes, "device_seconds": round(sum(s.device_seconds for s in series), 3)}
