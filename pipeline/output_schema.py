"""Output rows: one fixed Arrow schema per job so every part file (and every reader) agrees."""

from __future__ import annotations

import io
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.config import JobConfig
from prefixflow.pipeline.json_columns import shape_of

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


def output_schema(cfg: JobConfig, input_schema: pa.Schema | None) -> pa.Schema:
    """Base columns, then label columns for label jobs (``extracted`` for extract jobs), then the input
    columns the job keeps."""
    fields = list(BASE_FIELDS)
    if cfg.task == "label":
        fields.append(pa.field("label", pa.string()))
        fields.append(
            pa.field("label_probs", pa.struct([pa.field(lb, pa.float64()) for lb in cfg.label.labels]))
        )
    if cfg.task == "extract" and cfg.schema is not None:  # typed from the schema; `output` keeps the JSON text
        fields.append(pa.field("extracted", shape_of(cfg.schema).type))
    taken = {f.name for f in fields}
    for name in cfg.keep_columns:
        if name in taken:
            continue
        typ = pa.string()
        if input_schema is not None and name in input_schema.names:
            typ = input_schema.field(name).type
            if pa.types.is_dictionary(typ):
                typ = typ.value_type
        fields.append(pa.field(name, typ))
    return pa.schema(fields)


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
