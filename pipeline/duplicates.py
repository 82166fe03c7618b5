"""The duplicate-id index of a run: which (file, row) repeat an id seen earlier in (file, row) order."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.layout import Layout
from prefixflow.pipeline.sources import list_inputs
from prefixflow.pipeline.spec import JobSpec


def duplicate_index(spec: JobSpec) -> bytes:
    """Parquet bytes of every (file, row) whose id repeats an earlier one. Reads only the id column."""
    col = spec.config.id_column
    store, files = list_inputs(spec.input, spec.config.storage)
    seen: set[str] = set()
    dup_files: list[str] = []
    dup_rows: list[int] = []
    for f in files:
        try:
            pf = pq.ParquetFile(store.fs.open(f.path, "rb"))
            if col not in pf.schema_arrow.names:
                continue
            values = pf.read(columns=[col]).column(col).to_pylist()
        except Exception:
            continue  # an unreadable file fails its own shard later
        for i, v in enumerate(values):
            if v is None:
                continue
            key = str(v)
            if key in seen:
                dup_files.append(f.relpath)
                dup_rows.append(i)
            else:
                seen.add(key)
    table = pa.table(
        {"source_file": pa.array(dup_files, pa.string()), "row_index": pa.array(dup_rows, pa.int64())}
    )
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def load_duplicates(layout: Layout, relpath: str) -> set[tuple[str, int]]:
    """The duplicate rows of one input file, from the run's index (empty without an id column)."""
    if not layout.store.exists(layout.duplicates):
        return set()
    table = pq.read_table(io.BytesIO(layout.store.read_bytes(layout.duplicates)))
    return {(f, r) for f, r in zip(table.column("source_file").to_pylist(), table.column("row_index").to_pylist())
            if f == relpath}  # fmt: skip
