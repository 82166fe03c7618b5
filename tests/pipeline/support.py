"""Helpers shared by the pipeline tests: small Parquet datasets and the test engine settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

# Small engine settings shared by every test that runs the tiny model (in-process or in a subprocess),
# so their job fingerprints agree and greedy outputs are comparable.
ENGINE = {"max_model_len": 160, "max_num_seqs": 32}
MODEL = "tiny"


def docs(n: int, start: int = 0) -> list[dict[str, Any]]:
    words = ["apple", "river", "stone", "cloud", "ember", "maple", "north", "quiet"]
    return [{"id": f"doc-{i:04d}", "title": f"title {i}",
             "text": " ".join(words[(i + k) % len(words)] for k in range(3 + i % 5))}
            for i in range(start, start + n)]  # fmt: skip


def write_parquet(
    path: Path, rows: list[dict[str, Any]], row_group_size: int = 5, schema: pa.Schema | None = None
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path, row_group_size=row_group_size)
    return path


def write_dataset(
    folder: Path, files: int = 2, rows_per_file: int = 12, row_group_size: int = 5
) -> list[str]:
    ids = []
    for f in range(files):
        rows = docs(rows_per_file, start=f * rows_per_file)
        write_parquet(folder / f"part-{f}.parquet", rows, row_group_size)
        ids += [r["id"] for r in rows]
    return ids


def job(task: str = "generate", **extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"task": task, "id_column": "id", "engine": dict(ENGINE),
                            "sampling": {"max_tokens": 4}, "output": {"shard_rows": 10, "flush_rows": 4}}  # fmt: skip
    if task == "generate":
        base["template"] = "Write about {{ text }}"
    if task == "label":
        base["template"] = "Sentiment of: {{ text }}"
        base["label"] = {"labels": ["positive", "negative", "neutral"]}
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(base.get(key), dict):
            base[key] = {**base[key], **value}
        else:
            base[key] = value
    return base
