"""Throughput charts: a text sparkline (status), an SVG written with no dependency, a PNG with matplotlib.

The SVG is always written beside the run summary, so every run has a chart; matplotlib (the
``charts`` extra) adds a PNG for tools that do not show SVG.
"""

from __future__ import annotations

import math
from html import escape

from prefixflow.pipeline.run.throughput_series import LaneSeries, run_timeline

BLOCKS = "▁▂▃▄▅▆▇█"
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f")
WIDTH, HEIGHT, LEFT, RIGHT, TOP, BOTTOM = 760, 340, 70, 150, 40, 45


def sparkline(values: list[float], width: int = 60) -> str:
    """Values as block characters (averaged down to ``width``); an all-zero stretch shows as ▁."""
    if not values:
        return ""
    if len(values) > width:
        step = len(values) / width
        values = [
            _mean(values[int(i * step) : max(int((i + 1) * step), int(i * step) + 1)]) for i in range(width)
        ]
    top = max(values)
    if top <= 0:
        return BLOCKS[0] * len(values)
    return "".join(BLOCKS[min(int(v / top * (len(BLOCKS) - 1) + 0.5), len(BLOCKS) - 1)] for v in values)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else 0.0


def nice_ticks(top: float, count: int = 5) -> list[float]:
    """Round tick values from 0 to at least ``top`` (1, 2 or 5 times a power of ten apart)."""
    if top <= 0:
        return [0.0, 1.0]
    raw = top / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(math.ceil(top / step)) + 1)]


def _lines(series: list[LaneSeries]) -> tuple[list[tuple[str, list[tuple[float, float]]]], float]:
    """(label, [(seconds since the run's first lane started, tok/s)]) per lane, plus the run total."""
    t0 = min(s.started_at for s in series)
    lines = [
        (f"{s.lane}", [(s.started_at - t0 + i.start_s + i.seconds / 2, i.tokens_per_s) for i in s.intervals])
        for s in series
    ]
    if len(series) > 1:
        total = run_timeline(series)
        lines.append(("all lanes", [(i.start_s + i.seconds / 2, i.tokens_per_s) for i in total]))
    end = max((p[0] for _, pts in lines for p in pts), default=1.0)
    return lines, max(end, 1.0)


def svg_chart(series: list[LaneSeries], title: str = "prefixflow throughput") -> str:
    """A line chart of tok/s over time, one line per lane attempt (and their sum), as SVG text."""
    if not series:
        return ""
    lines, end = _lines(series)
    ymax = max((v for _, pts in lines for _, v in pts), default=1.0)
    yticks, xticks = nice_ticks(ymax), nice_ticks(end)
    ytop, xtop = yticks[-1] or 1.0, xticks[-1] or 1.0
    pw, ph = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t: float) -> float:
        return LEFT + pw * t / xtop

    def y(v: float) -> float:
        return TOP + ph * (1 - v / ytop)

    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{LEFT}" y="22" font-size="14" font-weight="bold">{escape(title)} (tok/s)</text>',
    ]
    for v in yticks:
        out.append(f'<line x1="{LEFT}" x2="{LEFT + pw}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{LEFT - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:,.0f}</text>')
    for t in xticks:
        out.append(f'<text x="{x(t):.1f}" y="{TOP + ph + 16}" text-anchor="middle">{t:,.0f}</text>')
    out.append(
        f'<text x="{LEFT + pw / 2}" y="{HEIGHT - 8}" text-anchor="middle">seconds since the first lane started</text>'
    )
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="#333"/>')
    for k, (label, pts) in enumerate(lines):
        color = "#000" if label == "all lanes" else COLORS[k % len(COLORS)]
        width = 2.5 if label == "all lanes" else 1.5
        path = " ".join(f"{x(t):.1f},{y(v):.1f}" for t, v in pts)
        out.append(f'<polyline fill="none" stroke="{color}" stroke-width="{width}" points="{path}"/>')
        ly = TOP + 14 + 16 * k
        out.append(
            f'<line x1="{LEFT + pw + 12}" x2="{LEFT + pw + 30}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
            f'stroke-width="{width}"/><text x="{LEFT + pw + 34}" y="{ly}">{escape(label)}</text>'
        )
    out.append("</svg>")
    return "\n".join(out) + "\n"


def png_chart(series: list[LaneSeries], title: str = "prefixflow throughput") -> bytes | None:
    """The same chart as PNG bytes when matplotlib is installed (``pip install prefixflow[charts]``),
    else None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    import io

    if not series:
        return None
    lines, _ = _lines(series)
    fig, ax = plt.subplots(figsize=(8, 3.6), dpi=100)
    for label, pts in lines:
        total = label == "all lanes"
        ax.plot(
            [t for t, _ in pts],
            [v for _, v in pts],
            label=label,
            linewidth=2.5 if total else 1.5,
            color="black" if total else None,
        )
    ax.set_title(f"{title} (tok/s)")
    ax.set_xlabel("seconds since the first lane started")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()
