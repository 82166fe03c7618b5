"""Draw the advisor's sample: rows spread over every shard and row group of the input, cheaply.

Reading a 10 M-row dataset to advise on it would cost more than the advice is worth, so the sample
reads at most ``UNIT_READ_ROWS`` rows from the start of each row group it visits, taking every
k-th of them, and visits row groups spread evenly over the input (all of them when they are fewer
than the rows wanted). Row groups are the unit, not shards: small shards cutting one row group into
many pieces must not make it be read many times. Small inputs are read whole. Unreadable files are
skipped and named.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from prefixflow.pipeline.job.config import JobConfig
from prefixflow.pipeline.storage.shards import Shard
from prefixflow.pipeline.storage.sources import list_inputs, parquet_file

UNIT_READ_ROWS = 4096  # at most this many rows are read from one row group


@dataclass(frozen=True)
class SampledRow:
    relpath: str
    row_index: int
    row: dict[str, Any]


@dataclass
class Sample:
    rows: list[SampledRow]
    total_rows: int  # rows in the whole input (from the Parquet footers)
    skipped_shards: list[str] = field(default_factory=list)  # unreadable at plan or sample time

    @property
    def scale(self) -> float:
        """How many input rows each sampled row stands for."""
        return self.total_rows / len(self.rows) if self.rows else 0.0


@dataclass(frozen=True)
class _Unit:
    """One row group of one file (shards may cut it; the sample reads it once whatever the shards)."""

    path: str
    relpath: str
    group: int
    start: int  # file row indexes [start, end)
    end: int

    @property
    def rows(self) -> int:
        return self.end - self.start


def _units(store: Any, path: str, relpath: str) -> list[_Unit]:
    meta = parquet_file(store, path).metadata
    out, offset = [], 0
    for i in range(meta.num_row_groups):
        n = meta.row_group(i).num_rows
        if n:
            out.append(_Unit(path, relpath, i, offset, offset + n))
        offset += n
    return out


def _quotas(units: list[_Unit], n: int) -> list[int]:
    """Rows to take per unit: all when the input is small, else proportional to size (largest
    remainder), and one each from evenly spaced units when there are more units than rows wanted."""
    total = sum(u.rows for u in units)
    if total <= n:
        return [u.rows for u in units]
    if len(units) >= n:
        picks = {int((i + 0.5) * len(units) / n) for i in range(n)}
        return [1 if i in picks else 0 for i in range(len(units))]
    exact = [u.rows * n / total for u in units]
    quota = [int(x) for x in exact]
    for i in sorted(range(len(units)), key=lambda i: exact[i] - quota[i], reverse=True)[: n - sum(quota)]:
        quota[i] += 1
    return [min(q, u.rows) for q, u in zip(quota, units)]


def _read_unit(store: Any, unit: _Unit, take: int, columns: list[str]) -> list[SampledRow]:
    """``take`` rows spread over the first ``UNIT_READ_ROWS`` rows of the unit (every k-th row)."""
    pf = parquet_file(store, unit.path)
    present = [c for c in dict.fromkeys(columns) if c in pf.schema_arrow.names]
    stride = max(1, min(unit.rows, max(UNIT_READ_ROWS, take)) // take)
    picks = [i * stride for i in range(take)]  # offsets in the row group
    out: list[SampledRow] = []
    offset = 0
    for batch in pf.iter_batches(batch_size=1024, row_groups=[unit.group], columns=present):
        mine = [i - offset for i in picks if offset <= i < offset + batch.num_rows]
        if mine:
            rows = batch.take(mine).to_pylist()
            out += [SampledRow(unit.relpath, unit.start + offset + j, r) for j, r in zip(mine, rows)]
        offset += batch.num_rows
        if offset > picks[-1]:
            break
    return out


class SampledJob(Protocol):
    """What the sample reads of a job (a ``JobSpec``): named here, below the job spec's layer, so the
    advisor and the label task's batch calibration (pipeline/tasks/label/batch.py) can both sample."""

    @property
    def input(self) -> str: ...

    @property
    def config(self) -> JobConfig: ...

    def input_columns(self) -> list[str]: ...


def sample_rows(spec: SampledJob, shards: list[Shard], n: int) -> Sample:
    """About ``n`` rows of the job's input (fewer when it is smaller), in file and row order."""
    if n < 1:
        raise ValueError(f"the sample needs at least one row, got {n}")
    total = sum(s.num_rows for s in shards if s.error is None)
    skipped = [s.shard_id for s in shards if s.error is not None]
    if not total:
        return Sample([], 0, skipped)
    store, _ = list_inputs(spec.input, spec.config.storage)
    files = {p.path: p.relpath for s in shards if s.error is None for p in s.ranges()}
    by_file: dict[str, list[str]] = {}
    for s in shards:
        for p in s.ranges():  # a packed shard covers several files
            by_file.setdefault(p.path, []).append(s.shard_id)
    units: list[_Unit] = []
    for path, relpath in files.items():
        try:
            units += _units(store, path, relpath)
        except Exception:  # unreadable since planning: leave it out, say so
            skipped += by_file[path]
    columns = spec.input_columns()
    rows: list[SampledRow] = []
    for unit, take in zip(units, _quotas(units, n)):
        if take:
            try:
                rows += _read_unit(store, unit, take, columns)
            except Exception:
                skipped += by_file[unit.path]
    return Sample(rows, total, sorted(set(skipped)))
