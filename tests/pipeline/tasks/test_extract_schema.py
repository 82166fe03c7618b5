"""The extract job's schema handling without a model: loading, up-front checks, typed Arrow columns that
polars, pyarrow and DuckDB read as data, and per-output validation."""

from __future__ import annotations

import json

import duckdb
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from prefixflow.pipeline.errors import JobConfigError
from prefixflow.pipeline.tasks.extract import Extraction, check_schema, load_schema
from prefixflow.pipeline.tasks.json_columns import shape_of, to_arrow

REVIEW = {
    "type": "object",
    "properties": {
        "sentiment": {"enum": ["positive", "negative", "neutral"]},
        "product": {"type": "string"},
        "stars": {"type": "integer", "minimum": 1, "maximum": 5},
        "price": {"type": ["number", "null"]},
        "issues": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
        "seller": {"$ref": "#/$defs/seller"},
        "extra": {"type": "object"},
        "either": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    },
    "required": ["sentiment", "product", "stars", "issues"],
    "$defs": {
        "seller": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "verified": {"type": "boolean"}},
        }
    },
}


def test_schema_maps_to_arrow_types():
    shape = shape_of(REVIEW)
    assert shape.type == pa.struct(
        [
            pa.field("sentiment", pa.string()),
            pa.field("product", pa.string()),
            pa.field("stars", pa.int64()),
            pa.field("price", pa.float64()),
            pa.field("issues", pa.list_(pa.string())),
            pa.field("seller", pa.struct([pa.field("name", pa.string()), pa.field("verified", pa.bool_())])),
            pa.field("extra", pa.string()),  # free-form object: its JSON text
            pa.field("either", pa.string()),  # mixed union: JSON text
        ]
    )


@pytest.mark.parametrize(
    "schema, expected",
    [
        ({"type": "integer"}, pa.int64()),
        ({"enum": [1, 2.5]}, pa.float64()),
        ({"const": True}, pa.bool_()),
        ({"anyOf": [{"type": "integer"}, {"type": "null"}]}, pa.int64()),
        ({"oneOf": [{"type": "integer"}, {"type": "number"}]}, pa.float64()),
        ({"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "string"}}, pa.string()),
        ({"type": "array"}, pa.string()),
        (
            {"type": "object", "properties": {"next": {"$ref": "#"}}},
            pa.struct([pa.field("next", pa.string())]),
        ),
        ({"$ref": "#/$defs/missing"}, pa.string()),
        ({"type": "null"}, pa.string()),
        ({}, pa.string()),
    ],
)
def test_what_has_no_single_arrow_type_is_kept_as_json_text(schema, expected):
    assert shape_of(schema).type == expected


def test_typed_column_reads_as_data_in_polars_pyarrow_and_duckdb(tmp_path):
    shape = shape_of(REVIEW)
    values = [
        {
            "sentiment": "negative",
            "product": "kettle",
            "stars": 2.0,
            "price": 19,
            "issues": ["leaks", "loud"],
            "seller": {"name": "A", "verified": True},
            "extra": {"k": [1]},
            "either": 3,
        },
        {"sentiment": "positive", "product": "lamp", "stars": 5, "issues": []},
        None,  # an error row
    ]
    rows = [{"id": str(i), "extracted": to_arrow(v, shape)} for i, v in enumerate(values)]
    schema = pa.schema([pa.field("id", pa.string()), pa.field("extracted", shape.type)])
    path = tmp_path / "part.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=schema), path)

    table = pq.read_table(path)
    assert table.schema.field("extracted").type == shape.type
    df = pl.read_parquet(path).unnest("extracted")
    assert df["stars"].dtype == pl.Int64 and df["stars"].to_list() == [2, 5, None]
    assert df["issues"].dtype == pl.List(pl.String) and df["issues"][0].to_list() == ["leaks", "loud"]
    assert df["price"].to_list() == [19.0, None, None]
    assert json.loads(df["extra"][0]) == {"k": [1]}
    con = duckdb.connect()
    got = con.execute(
        f"SELECT extracted.stars + 1, len(extracted.issues), extracted.seller.verified, typeof(extracted.stars) "
        f"FROM read_parquet('{path}') ORDER BY id"
    ).fetchall()
    assert got == [(3, 2, True, "BIGINT"), (6, 0, None, "BIGINT"), (None, None, None, "BIGINT")]


def test_load_schema_inline_text_and_files(tmp_path):
    assert load_schema(REVIEW) == REVIEW
    assert load_schema(json.dumps(REVIEW)) == REVIEW
    (tmp_path / "review.json").write_text(json.dumps(REVIEW))
    (tmp_path / "review.yaml").write_text("type: object\nproperties:\n  a: {type: integer}\n")
    assert load_schema("review.json", base_dir=str(tmp_path)) == REVIEW
    assert load_schema(str(tmp_path / "review.yaml")) == {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
    }


@pytest.mark.parametrize(
    "value, words",
    [
        ("missing.json", ["file", "missing.json", "not found"]),
        ('{"type": "object",}', ["not valid JSON"]),
        ("list.yaml", ["a JSON schema is a mapping, got list"]),
        (42, ["expected a JSON schema"]),
        ("", ["expected a JSON schema"]),
    ],
)
def test_bad_schema_values_name_the_problem(tmp_path, value, words):
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    with pytest.raises(JobConfigError) as err:
        load_schema(value, base_dir=str(tmp_path))
    for word in words:
        assert word in str(err.value)


@pytest.mark.parametrize(
    "schema, words",
    [
        ({"type": "objekt"}, ["invalid JSON schema at type", "objekt"]),
        (
            {"type": "object", "properties": {"a": {"type": "integer", "minimum": "one"}}},
            ["invalid JSON schema at properties/a/minimum", "'one'"],
        ),
        ({"type": "string", "pattern": "[a-"}, ["invalid JSON schema at pattern", "'[a-' is not a 'regex'"]),
        ({"type": "string", "pattern": "(a)\\1"}, ["schema", "Backreference is not supported"]),  # engine
        ({"type": "integer", "minimum": 5, "maximum": 1}, ["schema", "minimum"]),
    ],
)
def test_invalid_schemas_fail_up_front(schema, words):
    with pytest.raises(JobConfigError) as err:
        check_schema(schema)
    for word in words:
        assert word in str(err.value)


def test_outputs_are_validated_against_the_schema():
    ex = Extraction(REVIEW)
    good = '{"sentiment": "neutral", "product": "mug", "stars": 3, "issues": ["chipped"]}'
    value, kind, problem = ex.parse(good, "stop")
    assert kind is problem is None and value["stars"] == 3 and value["issues"] == ["chipped"]
    value, kind, problem = ex.parse('{"sentiment": "neutral", "product": "mu', "length")
    assert value is None and kind == "truncated_json" and "max_tokens was reached" in problem
    value, kind, problem = ex.parse(
        '{"sentiment": "meh", "product": "mug", "stars": 3, "issues": []}', "stop"
    )
    assert value is None and kind == "schema" and "$.sentiment" in problem and "'meh'" in problem
    value, kind, problem = ex.parse(
        '{"sentiment": "neutral", "product": "mug", "stars": 9, "issues": []}', "stop"
    )
    assert value is None and kind == "schema" and "$.stars" in problem and "maximum" in problem
    value, kind, problem = ex.parse("not json", "stop")
    assert value is None and kind == "schema" and "not valid JSON" in problem
