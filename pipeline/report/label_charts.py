"""The label report as pictures and text: the label distribution before and after calibration and,
with gold labels, the confusion matrix, written beside the run's other charts (``_labels.svg``, and
``_labels.png`` with matplotlib), and as Markdown for the Prefect artifact and plain lines for the CLI.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from html import escape
from typing import TYPE_CHECKING, Any

from prefixflow.pipeline.storage.layout import Layout

if TYPE_CHECKING:
    from prefixflow.pipeline.report.summary import RunSummary

SVG_FILE = "_labels.svg"
PNG_FILE = "_labels.png"
BEFORE, AFTER = "#9e9e9e", "#1f77b4"


def _shares(counts: Mapping[str, int], labels: Sequence[str]) -> list[float]:
    total = sum(counts.values()) or 1
    return [counts.get(lb, 0) / total for lb in labels]


def _labels_of(summary: RunSummary) -> list[str]:
    quality = summary.label_quality
    if quality.get("labels"):
        return list(quality["labels"])
    return sorted(set(summary.label_counts) | set(summary.label_counts_raw))


def svg_labels(summary: RunSummary) -> str:
    """Bars of each label's share before (raw scores) and after calibration, and the confusion
    matrix (rows: gold, columns: predicted) when the job has a gold column. SVG text, no dependency."""
    labels = _labels_of(summary)
    if not labels:
        return ""
    quality = summary.label_quality.get("calibrated")
    bar_w, gap, left, top, plot_h = 34, 26, 60, 50, 180
    width_bars = left + len(labels) * (2 * bar_w + gap) + 20
    cell = 40
    width_cm = (len(labels) * cell + 150) if quality else 0
    width, height = max(width_bars + width_cm, 420), top + plot_h + 110
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
        'font-family="sans-serif" font-size="11">',
        f'<rect width="{width}" height="{height}" fill="white"/>',
        f'<text x="{left}" y="20" font-size="14" font-weight="bold">labels: share of rows before / after '
        "calibration</text>",
    ]
    before, after = _shares(summary.label_counts_raw, labels), _shares(summary.label_counts, labels)
    base = top + plot_h
    out.append(f'<line x1="{left}" x2="{width_bars - 20}" y1="{base}" y2="{base}" stroke="#333"/>')
    for tick in (0.25, 0.5, 0.75, 1.0):
        y = base - plot_h * tick
        out.append(
            f'<line x1="{left}" x2="{width_bars - 20}" y1="{y:.1f}" y2="{y:.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{y + 4:.1f}" text-anchor="end">{tick:.0%}</text>'
        )
    for i, lb in enumerate(labels):
        x = left + 10 + i * (2 * bar_w + gap)
        for j, (share, color) in enumerate(((before[i], BEFORE), (after[i], AFTER))):
            if j == 0 and not summary.label_counts_raw:
                continue
            h = plot_h * share
            out.append(
                f'<rect x="{x + j * bar_w}" y="{base - h:.1f}" width="{bar_w - 4}" height="{h:.1f}" fill="{color}"/>'
                f'<text x="{x + j * bar_w + bar_w / 2 - 2}" y="{base - h - 3:.1f}" text-anchor="middle" '
                f'font-size="9">{share:.0%}</text>'
            )
        out.append(f'<text x="{x + bar_w}" y="{base + 14}" text-anchor="middle">{escape(lb[:14])}</text>')
    out.append(
        f'<rect x="{left}" y="{base + 30}" width="10" height="10" fill="{BEFORE}"/><text x="{left + 14}" '
        f'y="{base + 39}">before (raw scores)</text><rect x="{left + 140}" y="{base + 30}" width="10" '
        f'height="10" fill="{AFTER}"/><text x="{left + 154}" y="{base + 39}">after calibration</text>'
    )
    cal = summary.label_calibration
    if cal:
        note = f"calibration: {cal.get('applied')}" + (
            f" (fallback from {cal.get('method')})" if cal.get("fallback") else ""
        )
        out.append(f'<text x="{left}" y="{base + 60}">{escape(note)}</text>')
    if quality:
        out += _svg_confusion(quality, labels, width_bars + 80, top + 20, cell)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _svg_confusion(
    quality: Mapping[str, Any], labels: Sequence[str], x0: int, y0: int, cell: int
) -> list[str]:
    matrix = quality["confusion"]
    top = max((v for row in matrix for v in row), default=0) or 1
    ece = quality.get("ece")
    out = [
        f'<text x="{x0}" y="{y0 - 24}" font-size="12" font-weight="bold">confusion (rows: gold, columns: '
        f'predicted)</text><text x="{x0}" y="{y0 - 10}">accuracy {quality["accuracy"]:.3f}, macro-F1 '
        f"{quality['macro_f1']:.3f}" + (f", ECE {ece:.3f}" if ece is not None else "") + "</text>"
    ]
    for i, row in enumerate(matrix):
        out.append(
            f'<text x="{x0 - 4}" y="{y0 + i * cell + cell / 2 + 4}" text-anchor="end">{escape(labels[i][:10])}</text>'
        )
        for j, v in enumerate(row):
            shade = int(255 - 200 * v / top)
            fill = f"rgb({shade},{shade},255)"
            out.append(
                f'<rect x="{x0 + j * cell}" y="{y0 + i * cell}" width="{cell}" height="{cell}" fill="{fill}" '
                f'stroke="#fff"/><text x="{x0 + j * cell + cell / 2}" y="{y0 + i * cell + cell / 2 + 4}" '
                f'text-anchor="middle">{v}</text>'
            )
    for j, lb in enumerate(labels):
        out.append(
            f'<text x="{x0 + j * cell + cell / 2}" y="{y0 + len(labels) * cell + 14}" text-anchor="middle" '
            f'font-size="9">{escape(lb[:8])}</text>'
        )
    return out


def png_labels(summary: RunSummary) -> bytes | None:
    """The same picture as PNG with matplotlib (the ``charts`` extra), else None."""
    labels = _labels_of(summary)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    if not labels:
        return None
    import io

    quality = summary.label_quality.get("calibrated")
    fig, axes = plt.subplots(1, 2 if quality else 1, figsize=(10 if quality else 6, 3.8), dpi=100)
    ax = axes[0] if quality else axes
    xs = range(len(labels))
    if summary.label_counts_raw:
        ax.bar(
            [x - 0.2 for x in xs],
            _shares(summary.label_counts_raw, labels),
            0.4,
            color=BEFORE,
            label="before",
        )
    ax.bar(
        [x + 0.2 for x in xs],
        _shares(summary.label_counts, labels),
        0.4,
        color=AFTER,
        label="after calibration",
    )
    ax.set_xticks(list(xs), labels, rotation=20, fontsize=8)
    ax.set_ylabel("share of rows")
    ax.set_title("labels before / after calibration")
    ax.legend(fontsize=8)
    if quality:
        cm = axes[1]
        cm.imshow(quality["confusion"], cmap="Blues")
        for i, row in enumerate(quality["confusion"]):
            for j, v in enumerate(row):
                cm.text(j, i, str(v), ha="center", va="center", fontsize=8)
        cm.set_xticks(list(xs), labels, rotation=20, fontsize=8)
        cm.set_yticks(list(xs), labels, fontsize=8)
        cm.set_xlabel("predicted")
        cm.set_ylabel("gold")
        ece = quality.get("ece")
        cm.set_title(
            f"acc {quality['accuracy']:.3f}, macro-F1 {quality['macro_f1']:.3f}"
            + (f", ECE {ece:.3f}" if ece is not None else ""),
            fontsize=9,
        )
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    plt.close(fig)
    return buf.getvalue()


def write_label_charts(layout: Layout, summary: RunSummary) -> list[str]:
    """Write ``_labels.svg`` (and ``_labels.png``) beside the run summary for a label job; the paths."""
    svg = svg_labels(summary)
    if not svg:
        return []
    written = [layout.path(SVG_FILE)]
    layout.store.write_atomic(written[0], svg.encode())
    png = png_labels(summary)
    if png is not None:
        layout.store.write_atomic(layout.path(PNG_FILE), png)
        written.append(layout.path(PNG_FILE))
    return written


def report_lines(summary: RunSummary) -> list[tuple[str, str]]:
    """(name, text) rows of the label report for the CLI summary table."""
    rows: list[tuple[str, str]] = []
    cal = summary.label_calibration
    if cal:
        text = f"{cal['applied']}"
        if cal["applied"] != "contextual" or not cal.get("fallback"):
            text += f" from {cal['sample_rows']} sampled rows"
        text += (
            f"; the sample cost {cal['prompt_tokens']:,} prompt tokens ({cal['computed_tokens']:,} computed)"
        )
        if cal.get("fallback"):
            text += f"; fell back: {cal['fallback']}"
        rows.append(("calibration", text))
    if summary.label_counts_raw:
        rows.append(("labels before calibration", shares_text(summary.label_counts_raw)))
    for name in ("calibrated", "raw"):
        q = summary.label_quality.get(name)
        if q:
            ece = q.get("ece")
            rows.append(
                (
                    f"vs gold ({'after' if name == 'calibrated' else 'before'} calibration)",
                    f"accuracy {q['accuracy']:.3f}, macro-F1 {q['macro_f1']:.3f}"
                    + (f", ECE {ece:.3f}" if ece is not None else "")
                    + f" over {q['rows']} rows",
                )
            )
    q = summary.label_quality.get("calibrated")
    if q:
        labels = summary.label_quality["labels"]
        rows.append(
            (
                "confusion (gold: predicted)",
                "; ".join(f"{t}: " + " ".join(str(v) for v in row) for t, row in zip(labels, q["confusion"])),
            )
        )
    return rows


def shares_text(counts: Mapping[str, int]) -> str:
    """``billing 97% (291), shipping 2% (6)``: rows per label, most frequent first."""
    total = sum(counts.values()) or 1
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return ", ".join(f"{label} {n / total:.0%} ({n})" for label, n in ranked)


def markdown_labels(summary: RunSummary) -> str:
    """The label report for the Prefect artifact: distributions, quality, confusion, the SVG inline."""
    labels = _labels_of(summary)
    if not labels:
        return ""
    lines = [f"# prefixflow labels: {summary.output}", ""]
    for name, text in report_lines(summary):
        lines.append(f"- **{name}**: {text}")
    lines += ["", "| label | before calibration | after calibration |", "|---|---:|---:|"]
    raw, cal = summary.label_counts_raw, summary.label_counts
    for lb in labels:
        lines.append(f"| {lb} | {raw.get(lb, 0) if raw else '-'} | {cal.get(lb, 0)} |")
    q = summary.label_quality.get("calibrated")
    if q:
        lines += ["", "| gold \\ predicted | " + " | ".join(labels) + " |", "|---|" + "---:|" * len(labels)]
        lines += [
            f"| {t} | " + " | ".join(str(v) for v in row) + " |" for t, row in zip(labels, q["confusion"])
        ]
    svg = base64.b64encode(svg_labels(summary).encode()).decode()
    lines += ["", f"![labels](data:image/svg+xml;base64,{svg})"]
    return "\n".join(lines) + "\n"
