"""The id index of a run: which (file, row) repeat an id seen earlier in (file, row) order, and the null-id
rows whose derived id must differ from the default because a real id already has that value."""

from __future__ import annotations

import io
from collections.abc import Collection
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.job.spec import JobSpec
from prefixflow.pipeline.storage.sources import list_inputs, parquet_file
from prefixflow.pipeline.tasks.rows import derived_id


def duplicate_index(spec: JobSpec) -> bytes:
    """Parquet bytes of every (file, row) whose id repeats an id seen earlier in (file, row) order, with
    the row that used it first (so the error row can name it). Reads only the id column."""
    col = spec.config.id_column
    store, files = list_inputs(spec.input, spec.config.storage)
    seen: dict[str, tuple[str, int]] = {}
    nulls: list[tuple[str, int]] = []
    dups: dict[str, list[Any]] = {"source_file": [], "row_index": [], "first_file": [], "first_row": []}
    for f in files:
        try:
            pf = parquet_file(store, f.path)  # (read once per command: sources.reads_cached)
            if col not in pf.schema_arrow.names:
                continue
            values = pf.read(columns=[col]).column(col).to_pylist()
        except Exception:
            continue  # an unreadable file fails its own shard later
        for i, v in enumerate(values):
            if v is None:
                nulls.append((f.relpath, i))
                continue
            key = str(v)
            if key in seen:
                for name, value in zip(dups, (f.relpath, i, *seen[key])):
                    dups[name].append(value)
            else:
                seen[key] = (f.relpath, i)
    dups["derived_id"] = [None] * len(dups["source_file"])
    for (relpath, i), unique in unique_derived_ids(nulls, set(seen)).items():
        for name, value in zip(dups, (relpath, i, None, None, unique)):
            dups[name].append(value)
    types = {
        "source_file": pa.string(),
        "row_index": pa.int64(),
        "first_file": pa.string(),
        "first_row": pa.int64(),
        "derived_id": pa.string(),
    }
    table = pa.table({name: pa.array(values, types[name]) for name, values in dups.items()})
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def unique_derived_ids(nulls: list[tuple[str, int]], taken: set[str]) -> dict[tuple[str, int], str]:
    """The rows with a null id whose derived id (``a.parquet#3``) is also a real id of the input, each
    with a derived id no row uses (``a.parquet#3#``, one more ``#`` per further clash): the output's ids
    stay unique, so a reader joining on ``id`` never mixes a null-id error row with a real row."""
    renamed: dict[tuple[str, int], str] = {}
    used = set(taken)
    for relpath, i in nulls:
        derived = base = derived_id(relpath, i)
        while derived in used:
            derived += "#"
        used.add(derived)
        if derived != base:
            renamed[(relpath, i)] = derived
    return renamed


def load_derived_ids(table: pa.Table | None, relpaths: Collection[str]) -> dict[tuple[str, int], str]:
    """(file, row) -> derived id of the null-id rows of the files ``relpaths`` whose default derived id is
    taken, from the run's id index ``table`` (``Run.id_index``)."""
    if table is None or "derived_id" not in table.column_names:
        return {}
    rows = zip(
        table.column("source_file").to_pylist(),
        table.column("row_index").to_pylist(),
        table.column("derived_id").to_pylist(),
    )
    return {(f, r): d for f, r, d in rows if f in relpaths and d is not None}


def load_duplicates(
    table: pa.Table | None, relpaths: Collection[str]
) -> dict[tuple[str, int], tuple[str, int] | None]:
    """(file, row) of each repeated id in the files ``relpaths`` -> (file, row) of its first use (None in
    an index written by an older prefixflow), from the run's id index ``table``; empty without an id
    column. (A shard of packed small files covers several files.)"""
    if table is None:
        return {}
    files, rows = table.column("source_file").to_pylist(), table.column("row_index").to_pylist()
    firsts: list[tuple[str, int] | None] = [None] * len(files)
    if "first_file" in table.column_names:
        firsts = list(zip(table.column("first_file").to_pylist(), table.column("first_row").to_pylist()))
    renamed = (
        table.column("derived_id").to_pylist() if "derived_id" in table.column_names else [None] * len(files)
    )
    return {
        (f, r): first for f, r, first, d in zip(files, rows, firsts, renamed) if f in relpaths and d is None
    }
