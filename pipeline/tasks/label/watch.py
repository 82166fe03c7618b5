"""Label collapse: one label taking nearly every row of a job that lists several.

A small model that cannot tell the labels apart answers the same one for every row, often with
high confidence (issue 14: every support ticket labeled ``billing``, the first label listed). The
labels are plausible words, so nothing else looks wrong. ``LabelWatch`` checks the first rows of a
run as they finish and warns once; the run summary repeats the check over every committed row.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

COLLAPSE_SHARE = 0.8  # one label above this share of the labeled rows is a collapse
WINDOW_ROWS = 200  # the live check looks at the first labeled rows of a run
MIN_ROWS = 20  # fewer labeled rows than this say nothing either way


def collapse_warning(counts: Mapping[str, int], num_labels: int, where: str) -> str | None:
    """The warning text when one label holds more than COLLAPSE_SHARE of ``counts``, else None."""
    total = sum(counts.values())
    if num_labels < 2 or total < MIN_ROWS:
        return None
    label, n = max(counts.items(), key=lambda kv: (kv[1], kv[0]))
    if n / total <= COLLAPSE_SHARE:
        return None
    return (
        f"label collapse: {label!r} is {n / total:.0%} of {where} ({n} of {total}) although the job lists "
        f"{num_labels} labels; the model may be answering the prompt rather than the rows. Keep "
        "label.calibration on (contextual), describe each label in the prompt, or use a bigger model "
        "(docs/pipeline.md, 'Labeling jobs'); if the input really is mostly this label, ignore this"
    )


def label_counts(labels: list[Any]) -> dict[str, int]:
    """Counts of the non-null labels, sorted by label."""
    return dict(sorted(Counter(str(v) for v in labels if v is not None).items()))


class LabelWatch:
    """Counts the labels of the first WINDOW_ROWS labeled rows a shard loop finishes; warns once.

    One per shard loop (one engine lane), so it needs no lock. ``finish`` checks a run that ended
    before WINDOW_ROWS rows.
    """

    def __init__(self, num_labels: int, warn: Callable[[str], None], window: int = WINDOW_ROWS) -> None:
        self.num_labels = num_labels
        self.warn = warn
        self.window = window
        self.counts: Counter[str] = Counter()
        self.checked = False
        self.message: str | None = None

    def observe(self, record: Mapping[str, Any]) -> None:
        label = record.get("label")
        if self.checked or label is None:
            return
        self.counts[str(label)] += 1
        if sum(self.counts.values()) >= self.window:
            self._check(f"the first {self.window} labeled rows")

    def finish(self) -> None:
        if not self.checked:
            self._check(f"the {sum(self.counts.values())} labeled rows of this run")

    def _check(self, where: str) -> None:
        self.checked = True
        self.message = collapse_warning(self.counts, self.num_labels, where)
        if self.message:
            self.warn(self.message)
