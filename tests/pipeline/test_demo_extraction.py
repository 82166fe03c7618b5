"""The demo's extraction job on the tiny random model: every one of the 24 rows must parse and validate.
Bounded strings (maxLength) used to let raw control characters through (xgrammar 0.2.9's rule for
them), so the demo failed on every row."""

from __future__ import annotations

import json
import os
from pathlib import Path

import polars as pl
import pytest
from jsonschema import validators
from rich.console import Console

from prefixflow.pipeline import load_job
from prefixflow.pipeline.demo import DATA, write_sample
from prefixflow.pipeline.local_run import run_local


@pytest.mark.slow  # the whole 24-row job, about 20 s; tests/engine's bounded-string test is the fast one
def test_demo_extraction_on_the_tiny_model_parses_and_validates_every_row(tmp_path: Path) -> None:
    data = write_sample(str(tmp_path / "input"), 24)
    spec = load_job(data, str(tmp_path / "extract-out"), "tiny", str(DATA / "demo_extract.yaml"))
    run_local(spec, new_run=True, console=Console(file=open(os.devnull, "w")))
    rows = pl.read_parquet(str(tmp_path / "extract-out" / "data" / "**" / "*.parquet")).to_dicts()
    assert len(rows) == 24
    schema = spec.config.json_schema
    validator = validators.validator_for(schema)(schema)
    for row in rows:
        assert row["error"] is None, (row["error_class"], row["error"], row["output"])
        value = json.loads(row["output"])  # strict: a raw control character inside a string fails here
        assert not list(validator.iter_errors(value)) and value == row["extracted"]
