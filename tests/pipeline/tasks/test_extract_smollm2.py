"""The extract job on the embedded SmolLM2-135M-Instruct: 100 rows across three JSON schemas (enum field,
array of strings, nested objects, integers with bounds), every committed output parses and validates,
and its typed column holds what the raw JSON says."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import polars as pl
import pytest
import torch

from benchmarks.structured_workload import MAX_TOKENS, QUESTIONS, SCHEMAS, extraction_rows
from prefixflow.pipeline import load_job
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import write_parquet

pytestmark = pytest.mark.slow


def test_hundred_rows_across_three_schemas_parse_and_validate(tmp_path: Path) -> None:
    from prefixflow.engine import LLM

    torch.set_num_threads(1)
    rows = extraction_rows()
    assert len(rows) >= 100 and {name for name, _ in rows} == set(SCHEMAS)
    llm = LLM("smollm2-135m-instruct")
    total = 0
    for name, schema in SCHEMAS.items():
        texts = [text for n, text in rows if n == name]
        write_parquet(
            tmp_path / name / "in.parquet", [{"id": f"{name}-{i}", "text": t} for i, t in enumerate(texts)]
        )
        cfg = {
            "task": "extract",
            "id_column": "id",
            "schema": schema,
            "sampling": {"max_tokens": MAX_TOKENS},
            "template": QUESTIONS[name].replace("{text}", "{{ text }}"),
        }
        spec = load_job(str(tmp_path / name), str(tmp_path / f"{name}-out"), "smollm2-135m-instruct", cfg)
        summary, failures = run_local(spec, llm=llm, progress=False)
        assert failures == []
        df = pl.read_parquet(summary.data_glob)
        assert df.height == len(texts)
        committed = df.filter(pl.col("error").is_null())
        for row in committed.to_dicts():
            parsed = json.loads(row["output"])
            jsonschema.validate(parsed, schema)
            assert row["extracted"] == parsed
        # Bounded schemas fit in max_tokens, so no row should fail; the few a regression could cause
        # would be schema error rows, named as such.
        assert committed.height == df.height, df.filter(pl.col("error").is_not_null())[
            ["id", "error"]
        ].to_dicts()
        total += committed.height
    assert total >= 100
