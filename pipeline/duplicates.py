"""The duplicate-id index of a run: which (file, row) repeat an id seen earlier in (file, row) order."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.layout import Layout
from prefixflow.pipeline.sources import list_inputs
from prefixflow.pipeline.spec import JobSpec


def duplicate_index(spec: JobSpec) -> bytes:
    """Parquet bytes of every (file, row) whose id repeats an id seen earlier in (file, row) order, with
    the row that used it first (so the error row can name it). Reads only the id column."""
    col = spec.config.id_column
    store, files = list_inputs(spec.input, spec.config.storage)
    seen: dict[str, tuple[str, int]] = {}
    dups: dict[str, list[Any]] = {"source_file": [], "row_index": [], "first_file": [], "first_row": []}
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
                for name, value in zip(dups, (f.relpath, i, *seen[key])):
                    dups[name].append(value)
            else:
                seen[key] = (f.relpath, i)
    types = {"source_file": pa.string(), "row_index": pa.int64(), "first_file": pa.string(), "first_row": pa.int64()}
    table = pa.table({name: pa.array(values, types[name]) for name, values in dups.items()})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def load_duplicates(layout: Layout, relpath: str) -> dict[tuple[str, int], tuple[str, int] | None]:
    """(file, row) of each repeated id in ``relpath`` -> (file, row) of its first use (None in an index
    written by an older prefixflow); empty without an id column."""
    if not layout.store.exists(layout.duplicates):
        return {}
    table = pq.read_table(io.BytesIO(layout.store.read_bytes(layout.duplicates)))
    files, rows = table.column("source_file").to_pylist(), table.column("row_index").to_pylist()
    firsts: list[tuple[str, int] | None] = [None] * len(files)
    if "first_file" in table.column_names:
        firsts = list(zip(table.column("first_file").to_pylist(), table.column("first_row").to_pylist()))
    return {(f, r): first for f, r, first in zip(files, rows, firsts) if f == relpath}
