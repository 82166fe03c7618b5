"""Output rows: one Arrow schema per run, fixed at plan time, so every part file (and every reader) agrees.

Kept input columns take the type their input files agree on: types are unified across files (a column
missing from a file, or all-null there, takes the others' type; int32 and int64 give int64, int and float
give float64, string and large_string give large_string). Types that cannot be unified (string in one
file, list in another) are refused before the run starts, naming the column and the files.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.job.config import JobConfig

if TYPE_CHECKING:
    from prefixflow.pipeline.tasks.base import Task

BASE_FIELDS = [
    pa.field("id", pa.string(), nullable=False),
    pa.field("output", pa.string()),
    pa.field("finish_reason", pa.string()),
    pa.field("error", pa.string()),
    pa.field("error_class", pa.string()),
    pa.field("prompt_tokens", pa.int64()),
    pa.field("cached_tokens", pa.int64()),
    pa.field("output_tokens", pa.int64()),
    pa.field("latency_s", pa.float64()),
    pa.field("truncated", pa.bool_()),  # a long-document policy cut the input to fit the context
    pa.field("source_file", pa.string()),
    pa.field("row_index", pa.int64()),
]


SAMPLE = pa.struct(
    [
        pa.field("text", pa.string()),
        pa.field("finish_reason", pa.string()),
        pa.field("output_tokens", pa.int64()),
    ]
)


def output_schema(
    cfg: JobConfig, task: Task, kept_types: Mapping[str, pa.DataType] | None = None
) -> pa.Schema:
    """Base columns, then the task's own (``Task.output_fields``: a label job's ``label``, ``label_probs``
    ...; an extract job's ``extracted``), ``samples`` when a row has several, then the input columns the
    job keeps (typed by ``kept_types``, from ``kept_column_types``; string where unknown)."""
    fields = list(BASE_FIELDS) + task.output_fields(cfg)
    if cfg.sampling.n != 1 or "n" in cfg.sampling_columns:
        fields.append(pa.field("samples", pa.list_(SAMPLE)))  # every sample; `output` is the first
    taken = {f.name for f in fields}
    for name in cfg.keep_columns:
        if name not in taken:
            fields.append(pa.field(name, (kept_types or {}).get(name, pa.string())))
    return pa.schema(fields)


def kept_column_types(cfg: JobConfig, files: Sequence[tuple[str, pa.Schema]]) -> dict[str, pa.DataType]:
    """One type per kept column over all input ``files`` ((name, schema) pairs); raises JobConfigError
    naming the column and two files when their types cannot be unified."""
    out: dict[str, pa.DataType] = {}
    for name in cfg.keep_columns:
        seen: list[tuple[str, pa.DataType]] = []
        for relpath, schema in files:
            if name not in schema.names:
                continue
            typ = schema.field(name).type
            typ = typ.value_type if pa.types.is_dictionary(typ) else typ
            if not pa.types.is_null(typ):
                seen.append((relpath, typ))
        unified: pa.DataType = pa.string()
        for i, (relpath, typ) in enumerate(seen):
            if i == 0:
                unified = typ
                continue
            try:
                unified = (
                    pa.unify_schemas(
                        [pa.schema([pa.field(name, unified)]), pa.schema([pa.field(name, typ)])],
                        promote_options="permissive",
                    )
                    .field(name)
                    .type
                )
            except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                first = next((f for f, t in seen[:i] if not _merges(t, typ)), seen[0][0])
                raise JobConfigError(
                    f"keep_columns: column {name!r} is {dict(seen)[first]} in {first} but {typ} in {relpath}; "
                    "one output needs one type per column: cast it in the input files or drop it from keep_columns"
                ) from exc
        out[name] = unified
    return out


def _merges(a: pa.DataType, b: pa.DataType) -> bool:
    try:
        pa.unify_schemas(
            [pa.schema([pa.field("c", a)]), pa.schema([pa.field("c", b)])], promote_options="permissive"
        )
    except (pa.ArrowTypeError, pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return False
    return True


def schema_to_text(schema: pa.Schema) -> str:
    """The schema as text for the run record (Arrow IPC, base64)."""
    return base64.b64encode(schema.serialize().to_pybytes()).decode()


def schema_from_text(text: str) -> pa.Schema:
    return pa.ipc.read_schema(pa.py_buffer(base64.b64decode(text)))


def base_record(key: int, row_id: str, source: str, kept: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": row_id,
        "output": None,
        "finish_reason": None,
        "error": None,
        "error_class": None,
        "prompt_tokens": 0,
        "cached_tokens": 0,
        "output_tokens": 0,
        "latency_s": 0.0,
        "truncated": False,
        "source_file": source,
        "row_index": key,
        **kept,
    }


def error_record(base: dict[str, Any], error_class: str, message: str, **extra: Any) -> dict[str, Any]:
    return {**base, "finish_reason": "error", "error": message, "error_class": error_class, **extra}


def encode_part(records: list[dict[str, Any]], schema: pa.Schema) -> bytes:
    """Parquet bytes for one closed part file (durable only once closed, so parts are built whole)."""
    table = pa.Table.from_pylist(records, schema=schema)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()
