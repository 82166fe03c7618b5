"""Throughput over time as people see it: a table with sparklines for `status`, chart files beside the
run summary, and the per-run usage (tokens and device-seconds) cost reports are built on."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from prefixflow.pipeline.report.charts import png_chart, sparkline, svg_chart
from prefixflow.pipeline.run.throughput_series import LaneSeries, load_series, run_timeline, summary_of
from prefixflow.pipeline.storage.layout import Layout

SVG_FILE = "_throughput.svg"
PNG_FILE = "_throughput.png"


def throughput_table(series: list[LaneSeries]) -> Table:
    """One row per lane attempt (and the run when there are several): tok/s over time as a sparkline."""
    interval = max((s.interval_s for s in series), default=0.0)
    t = Table(title=f"throughput over time (tok/s per {interval:g} s interval)", title_justify="left")
    for name in ("lane", "tok/s over time", "rows", "peak tok/s", "median tok/s", "idle", "device-s"):
        t.add_column(name, justify="left" if name in ("lane", "tok/s over time") else "right")
    summary = summary_of(series)["lanes"]
    for s, info in zip(series, summary):
        t.add_row(
            s.lane,
            sparkline([i.tokens_per_s for i in s.intervals], 40),
            f"{info['rows']:,}",
            f"{info['peak_tokens_per_s']:,.0f}",
            f"{info['median_tokens_per_s']:,.0f}",
            f"{info['idle_intervals']}/{len(s.intervals)}",
            f"{info['device_seconds']:,.0f}",
        )
    if len(series) > 1:
        total = run_timeline(series)
        rates = sorted(i.tokens_per_s for i in total)
        t.add_row(
            "all lanes",
            sparkline([i.tokens_per_s for i in total], 40),
            f"{sum(i.rows for i in total):,}",
            f"{rates[-1]:,.0f}" if rates else "0",
            f"{rates[len(rates) // 2]:,.0f}" if rates else "0",
            f"{sum(1 for i in total if i.rows == 0)}/{len(total)}",
            f"{sum(s.device_seconds for s in series):,.0f}",
        )
    return t


def write_charts(layout: Layout, series: list[LaneSeries] | None = None) -> list[str]:
    """Write ``_throughput.svg`` (always) and ``_throughput.png`` (with matplotlib) beside the run
    summary; returns the paths written (none when nothing was recorded)."""
    series = load_series(layout) if series is None else series
    if not series:
        return []
    written = []
    svg = layout.path(SVG_FILE)
    layout.store.write_atomic(svg, svg_chart(series).encode())
    written.append(svg)
    png = png_chart(series)
    if png is not None:
        layout.store.write_atomic(layout.path(PNG_FILE), png)
        written.append(layout.path(PNG_FILE))
    return written


def usage(totals: dict[str, Any], series: list[LaneSeries]) -> dict[str, Any]:
    """What a run consumed: prompt tokens (of which served by the prefix cache), output tokens, and
    device-seconds (each lane's devices x the time its shard loop ran, every attempt counted: retried
    work cost device time too)."""
    prompt, cached = int(totals.get("prompt_tokens", 0)), int(totals.get("cached_tokens", 0))
    return {
        "prompt_tokens": prompt,
        "cached_tokens": cached,
        "computed_prompt_tokens": prompt - cached,
        "output_tokens": int(totals.get("output_tokens", 0)),
        "device_seconds": round(sum(s.device_seconds for s in series), 3),
    }


def markdown_report(spec_output: str, layout: Layout) -> str:
    """Usage and throughput over time as Markdown (the Prefect artifact): a table per lane with a
    sparkline, and the SVG chart inline."""
    import base64

    series = load_series(layout)
    if not series:
        return f"# prefixflow throughput\n\nNo throughput recorded under {spec_output} yet.\n"
    info = summary_of(series)
    lines = [
        f"# prefixflow throughput: {spec_output}",
        "",
        "| lane | tok/s over time | rows | prompt tokens | cached | output tokens | peak tok/s | device-s |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s, lane in zip(series, info["lanes"]):
        lines.append(
            f"| {s.lane} | `{sparkline([i.tokens_per_s for i in s.intervals], 40)}` | {lane['rows']:,} | "
            f"{lane['prompt_tokens']:,} | {lane['cached_tokens']:,} | {lane['output_tokens']:,} | "
            f"{lane['peak_tokens_per_s']:,.0f} | {lane['device_seconds']:,.1f} |"
        )
    svg = base64.b64encode(svg_chart(series).encode()).decode()
    lines += [
        "",
        f"![tok/s over time](data:image/svg+xml;base64,{svg})",
        "",
        f"Device-seconds in all: {info['device_seconds']:,.1f}. Each lane attempt is one line; retried "
        "attempts count too.",
    ]
    return "\n".join(lines) + "\n"
