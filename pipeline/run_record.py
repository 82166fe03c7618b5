"""The output root: job fingerprint (refuse to mix runs), duplicate-id index, new-run reset."""

from __future__ import annotations

import io
import json
import os
import time
from dataclasses import asdict
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.errors import (
    FingerprintMismatch,
    JobConfigError,
    OutputNotPrepared,
    OutputStateError,
)
from prefixflow.pipeline.layout import OWNED, Layout
from prefixflow.pipeline.planning import check_input_columns
from prefixflow.pipeline.sources import list_inputs
from prefixflow.pipeline.spec import JobSpec
from prefixflow.pipeline.storage import Store


def output_layout(spec: JobSpec) -> Layout:
    if not spec.output:
        raise JobConfigError("output: pass a local folder or an s3:// URL for the results")
    return Layout(Store.open(spec.output, spec.config.storage))


def _check_output_root(spec: JobSpec, layout: Layout) -> None:
    """Refuse an output root that cannot hold a run, with what to fix (before anything is written)."""
    fs, root = layout.store.fs, layout.store.root
    try:
        is_file = fs.isfile(root)
    except OSError as exc:
        raise OutputStateError(f"output {spec.output}: cannot be checked ({exc}); fix the URL, "
                               "credentials (--storage-option) or --endpoint-url") from exc  # fmt: skip
    if is_file:
        raise OutputStateError(f"output {spec.output} is an existing file; --output must be a folder "
                               "(new or from an earlier run of this job)")  # fmt: skip
    if layout.store.is_local:
        parent = root
        while not os.path.exists(parent):
            parent = os.path.dirname(parent)
        if not os.path.isdir(parent):
            raise OutputStateError(
                f"output {spec.output}: {parent} is a file, so the folder cannot be created"
            )
        if not os.access(parent, os.W_OK | os.X_OK):
            raise OutputStateError(f"output {spec.output}: {parent} is not writable; pick another --output")


def _record(spec: JobSpec) -> dict[str, Any]:
    job = asdict(spec.config)
    job["storage"] = {"endpoint_url": spec.config.storage.endpoint_url, "options": {}}  # no secrets on disk
    return {
        "fingerprint_hash": spec.fingerprint_hash(),
        "fingerprint": spec.fingerprint(),
        "spec": {"input": spec.input, "output": spec.output, "model": spec.model, "job": job},
        "created_at": time.time(),
    }


def _diff(old: dict[str, Any], new: dict[str, Any], prefix: str = "") -> list[str]:
    keys = sorted(set(old) | set(new))
    out = []
    for k in keys:
        a, b = old.get(k), new.get(k)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _diff(a, b, f"{prefix}{k}.")
        elif json.dumps(a, default=str) != json.dumps(b, default=str):
            out.append(f"{prefix}{k}: {a!r} -> {b!r}")
    return out


def read_run_record(layout: Layout) -> dict[str, Any] | None:
    if not layout.store.exists(layout.fingerprint):
        return None
    try:
        record = json.loads(layout.store.read_bytes(layout.fingerprint))
    except (OSError, ValueError) as exc:
        record, why = None, f"{type(exc).__name__}: {exc}"
    else:
        why = "fields are missing"
    if not isinstance(record, dict) or not {"fingerprint_hash", "fingerprint", "spec"} <= set(record):
        raise OutputStateError(
            f"{layout.fingerprint} is not a readable prefixflow run record ({why}); pass --new-run "
            "(prepare_output(new_run=True)) to discard that run, or write to another --output"
        )
    return record


def check_fingerprint(spec: JobSpec, layout: Layout, record: dict[str, Any] | None) -> dict[str, Any]:
    """The run record, if it is this job's; raises OutputNotPrepared or FingerprintMismatch otherwise."""
    if record is None:
        raise OutputNotPrepared(f"{spec.output} has no job fingerprint; call prepare_output(spec) first")
    if record["fingerprint_hash"] != spec.fingerprint_hash():
        changes = _diff(record["fingerprint"], json.loads(json.dumps(spec.fingerprint(), default=str)))
        raise FingerprintMismatch(
            f"{spec.output} already holds a run of a different job (fingerprint {record['fingerprint_hash']}, "
            f"this job {spec.fingerprint_hash()}). Changed: {'; '.join(changes[:8]) or 'unknown'}. "
            "Resume with the original settings, write to another --output, or pass --new-run "
            "(prepare_output(new_run=True)) to discard the old results."
        )
    return record


def prepare_output(spec: JobSpec, new_run: bool = False) -> None:
    """Write the job fingerprint (exclusively) or check it against the existing run; index duplicate ids.

    Fails fast (JobConfigError) when a column the job names is in none of the input files.
    ``new_run=True`` deletes what an earlier run with a *different* fingerprint left under the output
    root (only prefixflow's own files and folders) and starts over; a run with the same fingerprint is
    resumed as usual. Output-state problems (a file, unwritable) raise OutputStateError.
    """
    layout = output_layout(spec)
    _check_output_root(spec, layout)
    blob = json.dumps(_record(spec), indent=1, sort_keys=True, default=str).encode()  # checks the model
    check_input_columns(spec)
    if new_run and not _same_run(spec, layout):
        for name in OWNED:
            target = layout.path(name)
            if layout.store.exists(target):
                layout.store.remove_tree(target)
    try:
        created = layout.store.create_exclusive(layout.fingerprint, blob)
    except OSError as exc:
        raise OutputStateError(f"output {spec.output}: cannot write {layout.fingerprint} "
                               f"({type(exc).__name__}: {exc}); fix the path or its permissions") from exc  # fmt: skip
    if not created:
        check_fingerprint(spec, layout, read_run_record(layout))
    if spec.config.id_column and not layout.store.exists(layout.duplicates):
        layout.store.write_atomic(layout.duplicates, _duplicate_index(spec))


def _same_run(spec: JobSpec, layout: Layout) -> bool:
    """An earlier run with this job's fingerprint is resumed, even under ``new_run``."""
    try:
        record = read_run_record(layout)
    except OutputStateError:
        return False
    return record is not None and record["fingerprint_hash"] == spec.fingerprint_hash()


def _duplicate_index(spec: JobSpec) -> bytes:
    """Every (file, row) whose id repeats an id seen earlier in (file, row) order, with the row that
    used it first (so the error row can name it). Reads only the id column."""
    col = spec.config.id_column
    store, files = list_inputs(spec.input, spec.config.storage)
    seen: dict[str, tuple[str, int]] = {}
    dups: dict[str, list] = {"source_file": [], "row_index": [], "first_file": [], "first_row": []}
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
    written by an older prefixflow)."""
    if not layout.store.exists(layout.duplicates):
        return {}
    table = pq.read_table(io.BytesIO(layout.store.read_bytes(layout.duplicates)))
    files, rows = table.column("source_file").to_pylist(), table.column("row_index").to_pylist()
    if "first_file" in table.column_names:
        firsts = list(zip(table.column("first_file").to_pylist(), table.column("first_row").to_pylist()))
    else:
        firsts = [None] * len(files)
    return {(f, r): first for f, r, first in zip(files, rows, firsts) if f == relpath}
