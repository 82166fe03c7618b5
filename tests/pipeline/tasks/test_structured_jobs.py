"""Structured outputs through the pipeline on the tiny model: ``task: extract`` with typed columns,
``label.mode: constrained``, ``sampling.structured`` on a generate job, schema error rows, and bad
schemas or regexes failing before any work with exit 2."""

from __future__ import annotations

import json
import re
from pathlib import Path

import duckdb
import jsonschema
import polars as pl
import pyarrow.parquet as pq
import pytest
import yaml

from prefixflow.pipeline import load_job
from prefixflow.pipeline.cli import main
from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.local_run import run_local
from tests.pipeline.support import job, write_dataset

# Bounded (enums, integer range, maxItems) so random weights always finish inside max_tokens.
SCHEMA = {
    "type": "object",
    "properties": {
        "sentiment": {"type": "string", "enum": ["positive", "negative"]},
        "score": {"type": "integer", "minimum": 0, "maximum": 9},
        "facts": {
            "type": "object",
            "properties": {"fresh": {"type": "boolean"}},
            "required": ["fresh"],
            "additionalProperties": False,
        },
        "topics": {"type": "array", "items": {"enum": ["apple", "river"]}, "maxItems": 2},
    },
    "required": ["sentiment", "score", "facts", "topics"],
    "additionalProperties": False,
}


def _extract_job(**extra):
    base = job("extract", template="Extract from: {{ text }}", schema=SCHEMA, sampling={"max_tokens": 60})
    return {**base, **extra}


def _run(tmp_path: Path, llm, cfg: dict, name: str = "out"):
    spec = load_job(str(tmp_path / "in"), str(tmp_path / name), "tiny", cfg)
    summary, failures = run_local(spec, llm=llm, progress=False)
    assert failures == []
    return summary


def test_extract_job_writes_typed_columns_that_validate(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=8)
    summary = _run(tmp_path, tiny_llm, _extract_job())
    df = pl.read_parquet(summary.data_glob).sort("row_index")
    assert df.height == 8 and summary.error_rows == 0
    for row in df.to_dicts():
        parsed = json.loads(row["output"])  # the raw JSON text is kept
        jsonschema.validate(parsed, SCHEMA)
        assert row["extracted"] == parsed
    flat = df.unnest("extracted")
    assert flat["score"].dtype == pl.Int64 and flat["topics"].dtype == pl.List(pl.String)
    assert flat["facts"].dtype == pl.Struct({"fresh": pl.Boolean})
    assert (
        pq.read_schema(next(Path(tmp_path / "out" / "data").rglob("*.parquet")))
        .field("extracted")
        .type.num_fields
        == 4
    )
    got = (
        duckdb.connect()
        .execute(
            f"SELECT count(*), min(extracted.score), max(len(extracted.topics)), typeof(extracted.facts.fresh) "
            f"FROM read_parquet('{summary.data_glob}', hive_partitioning=false) GROUP BY 4"
        )
        .fetchall()
    )
    assert got[0][0] == 8 and 0 <= got[0][1] <= 9 and got[0][2] <= 2 and got[0][3] == "BOOLEAN"


def test_output_cut_by_max_tokens_is_a_truncated_json_error_row(tmp_path: Path, tiny_llm) -> None:
    """max_tokens ending a constrained output is named as such (it was a ``schema`` error)."""
    write_dataset(tmp_path / "in", files=1, rows_per_file=4)
    summary = _run(tmp_path, tiny_llm, _extract_job(sampling={"max_tokens": 6}))
    df = pl.read_parquet(summary.data_glob)
    assert summary.error_rows == 4 and summary.errors_by_class == {"truncated_json": 4}
    for row in df.to_dicts():
        assert row["error_class"] == "truncated_json" and "max_tokens was reached" in row["error"]
        assert row["extracted"] is None and row["output"]  # the partial text stays for inspection
        assert row["output"].startswith("{")


def test_constrained_label_mode_yields_only_labels(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=6)
    cfg = job("label", label={"mode": "constrained", "choice_prefix": ""}, sampling={"max_tokens": 8})
    summary = _run(tmp_path, tiny_llm, cfg)
    df = pl.read_parquet(summary.data_glob)
    assert summary.error_rows == 0
    assert set(df["label"]) <= {"positive", "negative", "neutral"}
    assert (df["output"] == df["label"]).all()


def test_generate_job_with_a_regex_constraint(tmp_path: Path, tiny_llm) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=5)
    cfg = job("generate", sampling={"max_tokens": 12, "structured": {"regex": "[A-Z]{3}-[0-9]{2}"}})
    df = pl.read_parquet(_run(tmp_path, tiny_llm, cfg).data_glob)
    assert all(re.fullmatch("[A-Z]{3}-[0-9]{2}", text) for text in df["output"])


def test_schema_from_a_file_beside_the_job_and_its_content_in_the_fingerprint(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=2)
    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "review.yaml").write_text(yaml.safe_dump(SCHEMA))
    job_file = tmp_path / "jobs" / "extract.yaml"
    job_file.write_text(yaml.safe_dump(_extract_job(schema="review.yaml")))
    spec = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", str(job_file))
    assert spec.config.json_schema == SCHEMA
    other = dict(SCHEMA, required=["sentiment"])
    (tmp_path / "jobs" / "review.yaml").write_text(yaml.safe_dump(other))
    changed = load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", str(job_file))
    assert changed.fingerprint_hash() != spec.fingerprint_hash()


@pytest.mark.parametrize(
    "cfg, words",
    [
        (job("extract", template="{{ text }}"), ["schema", "an extract job needs a JSON schema"]),
        (_extract_job(schema={"type": "objekt"}), ["schema", "invalid JSON schema at type"]),
        (_extract_job(schema={"type": "integer", "minimum": 3, "maximum": 1}), ["schema", "minimum"]),
        (_extract_job(schema="nowhere.json"), ["schema", "nowhere.json", "not found"]),
        (job("generate", schema=SCHEMA), ["schema", "applies to extract jobs only"]),
        (
            job("generate", sampling={"structured": {"regex": "(ab"}}),
            ["sampling.structured", "invalid regex"],
        ),
        (
            job("generate", sampling={"structured": {"regexp": "a"}}),
            ["sampling.structured.regexp", "'regex'"],
        ),
        (
            job("generate", sampling={"structured": {"grammar": 'root ::= "a" | b'}}),
            ['Rule "b" is not defined'],
        ),
        (job("generate", sampling={"structured": {"regex": "a", "choice": ["a"]}}), ["exactly one"]),
        (_extract_job(sampling={"structured": {"regex": "a"}}), ["already constrained to its schema"]),
        (_extract_job(sampling={"ignore_eos": True}), ["sampling.ignore_eos", "constrained"]),
        (job("label", label={"mode": "constrained"}, sampling={"min_tokens": 2}), ["sampling.min_tokens"]),
        (job("label", label={"mode": "constrain"}), ["label.mode", "constrained"]),
    ],
)
def test_bad_constraints_fail_before_any_work(tmp_path: Path, cfg: dict, words: list[str]) -> None:
    with pytest.raises(JobConfigError) as err:
        load_job(str(tmp_path / "in"), str(tmp_path / "out"), "tiny", cfg)
    for word in words:
        assert word in str(err.value), str(err.value)


def test_cli_exits_2_naming_a_bad_regex_and_a_bad_schema(tmp_path: Path, capsys) -> None:
    write_dataset(tmp_path / "in", files=1, rows_per_file=2)
    cases = [
        (job("generate", sampling={"structured": {"regex": "[a-"}}), "Unclosed '['"),
        (_extract_job(schema={"type": "string", "pattern": "(a)\\1"}), "Backreference is not supported"),
    ]
    for cfg, words in cases:
        path = tmp_path / "bad.yaml"
        path.write_text(yaml.safe_dump(cfg))
        code = main(
            [
                "run",
                "--input",
                str(tmp_path / "in"),
                "--output",
                str(tmp_path / "out"),
                "--job",
                str(path),
                "--model",
                "tiny",
            ]
        )
        err = capsys.readouterr().err
        assert code == 2, err
        assert words in err
        assert not (tmp_path / "out").exists()  # nothing written


@pytest.mark.parametrize(
    "path", ["configs/jobs/extract.yaml", "pipeline/data/demo_extract.yaml", "configs/jobs/label.yaml"]
)
def test_shipped_job_configs_load(tmp_path: Path, path: str) -> None:
    spec = load_job(
        str(tmp_path / "in"), str(tmp_path / "out"), "tiny", str(Path(__file__).resolve().parents[3] / path)
    )
    if spec.config.task == "extract":
        assert spec.config.json_schema is not None and spec.config.json_schema["required"]
