"""The progress display's numbers: rows, tokens/s and prefix-cache hit rate."""

from __future__ import annotations

import io

from rich.console import Console

from prefixflow.pipeline.progress import RichProgress


def test_progress_counts_rows_and_rates() -> None:
    out = io.StringIO()
    with RichProgress(10, console=Console(file=out, force_terminal=True, width=120), enabled=True) as bar:
        bar.advance(4)
        bar.advance(1, prompt_tokens=100, cached_tokens=25, output_tokens=10)
    assert bar.prompt_tokens == 100 and bar.cached_tokens == 25 and bar.output_tokens == 10
    assert "prefix hit 25%" in bar.rate_text()
    assert "5/10" in out.getvalue()
