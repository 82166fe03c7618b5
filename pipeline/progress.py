"""A rich progress display for long runs: rows done/total, tokens/s, prefix-cache hit rate, ETA."""

from __future__ import annotations

import sys
import time

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


class RichProgress:
    """Implements pipeline.shard_execution.ProgressSink. Use as a context manager around the shard loop."""

    def __init__(self, total_rows: int, console: Console | None = None, enabled: bool | None = None) -> None:
        self.console = console or Console(stderr=True)
        self.enabled = sys.stderr.isatty() if enabled is None else enabled
        self.total = total_rows
        self.prompt_tokens = self.cached_tokens = self.output_tokens = 0
        self.start = time.perf_counter()
        self._progress = Progress(
            TextColumn("[bold]rows"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[rate]}"),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not self.enabled,
            refresh_per_second=4,
        )
        self._task = self._progress.add_task("rows", total=total_rows, rate="")

    def __enter__(self) -> RichProgress:
        self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.stop()

    def advance(
        self, rows: int, prompt_tokens: int = 0, cached_tokens: int = 0, output_tokens: int = 0
    ) -> None:
        self.prompt_tokens += prompt_tokens
        self.cached_tokens += cached_tokens
        self.output_tokens += output_tokens
        self._progress.update(self._task, advance=rows, rate=self.rate_text())

    def rate_text(self) -> str:
        elapsed = max(time.perf_counter() - self.start, 1e-9)
        tps = (self.prompt_tokens + self.output_tokens) / elapsed
        hit = self.cached_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
        return f"{tps:,.0f} tok/s  out {self.output_tokens / elapsed:,.1f} tok/s  prefix hit {hit:.0%}"
