"""Planning: files, folders and globs become row-group-aligned shards with stable ids."""

from __future__ import annotations

from pathlib import Path

import pytest

from prefixflow.pipeline import InputError, describe_shards, load_job, plan_shards
from tests.pipeline.support import docs, write_dataset, write_parquet


def _spec(inp: str, **kw):
    return load_job(inp, "", "tiny", {"task": "summarize", "id_column": "id"}, **kw)


def test_folder_is_split_by_row_groups(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in", files=2, rows_per_file=12, row_group_size=5)
    shards = plan_shards(_spec(str(tmp_path / "in"), shard_rows=10))
    assert [(s.relpath, s.row_start, s.row_end) for s in shards] == [
        ("part-0.parquet", 0, 10),
        ("part-0.parquet", 10, 12),
        ("part-1.parquet", 0, 10),
        ("part-1.parquet", 10, 12),
    ]
    assert sum(s.num_rows for s in shards) == 24
    again = plan_shards(_spec(str(tmp_path / "in"), shard_rows=10))
    assert [s.shard_id for s in again] == [s.shard_id for s in shards]
    other = plan_shards(_spec(str(tmp_path / "in"), shard_rows=5))
    assert len(other) == 6 and other[0].shard_id != shards[0].shard_id


def test_file_glob_and_nested_folders(tmp_path: Path) -> None:
    write_parquet(tmp_path / "in" / "a" / "x.parquet", docs(3))
    write_parquet(tmp_path / "in" / "b" / "y.parquet", docs(4))
    (tmp_path / "in" / "notes.txt").write_text("not parquet")
    planned = plan_shards(_spec(str(tmp_path / "in")))  # two small files: one packed shard (issue 22)
    assert [p.relpath for s in planned for p in s.ranges()] == ["a/x.parquet", "b/y.parquet"]
    assert [s.num_rows for s in plan_shards(_spec(str(tmp_path / "in" / "b" / "y.parquet")))] == [4]
    assert [s.relpath for s in plan_shards(_spec(str(tmp_path / "in" / "*" / "x.parquet")))] == [
        "a/x.parquet"
    ]


def test_big_row_group_is_split(tmp_path: Path) -> None:
    write_parquet(tmp_path / "big.parquet", docs(50), row_group_size=50)
    shards = plan_shards(_spec(str(tmp_path / "big.parquet"), shard_rows=10))
    assert [(s.row_start, s.row_end) for s in shards] == [(i, i + 10) for i in range(0, 50, 10)]


def test_missing_and_empty_inputs_fail_with_a_message(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="does not exist"):
        plan_shards(_spec(str(tmp_path / "nope")))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no Parquet files"):
        plan_shards(_spec(str(tmp_path / "empty")))


def test_corrupt_file_gets_a_failing_shard_others_plan(tmp_path: Path) -> None:
    write_parquet(tmp_path / "in" / "good.parquet", docs(4))
    (tmp_path / "in" / "bad.parquet").write_bytes(b"PAR1 this is not a parquet file")
    shards = plan_shards(_spec(str(tmp_path / "in")))
    bad = [s for s in shards if s.error]
    assert len(bad) == 1 and "bad.parquet" in bad[0].error and bad[0].num_rows == 0
    assert [s.num_rows for s in shards if not s.error] == [4]


def test_describe_shards(tmp_path: Path) -> None:
    write_dataset(tmp_path / "in")
    spec = _spec(str(tmp_path / "in"), shard_rows=10)
    infos = describe_shards(spec, plan_shards(spec))
    keys = [i.prefix_key for i in infos]
    assert len(set(keys)) == len(keys) and all(k.startswith("summarize:") for k in keys)
    other = load_job(spec.input, "", "tiny", {"task": "summarize", "template": "Other {{ document }}"})
    assert describe_shards(other, plan_shards(other))[0].prefix_key.split(":")[1] != keys[0].split(":")[1]
    assert all(i.est_tokens > 0 for i in infos)
    assert infos[0].est_tokens > infos[1].est_tokens  # 10 rows vs 2 rows


def test_prefix_keys_group_shards_by_their_prompts_not_file_order(tmp_path: Path) -> None:
    x = "You are a careful legal analyst. Read the contract clause below and list every obligation. " * 3
    y = "You are a friendly travel writer. Turn the notes below into a short, upbeat paragraph. " * 3

    def rows(instruction: str | None, n: int = 6) -> list[dict]:
        return [{"instruction": instruction, "text": f"row {i}"} for i in range(n)]

    write_parquet(tmp_path / "in" / "a.parquet", rows(x), row_group_size=3)
    write_parquet(tmp_path / "in" / "b.parquet", rows(y), row_group_size=3)
    write_parquet(tmp_path / "in" / "c.parquet", rows(x), row_group_size=3)
    write_parquet(
        tmp_path / "in" / "d.parquet", [{"instruction": None, "text": "bad first row"}] + rows(y, 2)
    )
    spec = load_job(
        str(tmp_path / "in"), "", "tiny", {"template": "{{ instruction }}\n\n{{ text }}"}, shard_rows=3
    )
    infos = describe_shards(spec, plan_shards(spec))  # d's unrenderable first row must not fail it
    assert len(infos) == 7
    files = [i.shard.relpath for i in sorted(infos, key=lambda i: i.prefix_key)]
    x_at = [n for n, f in enumerate(files) if f in ("a.parquet", "c.parquet")]
    assert x_at == list(range(x_at[0], x_at[0] + 4)), files  # a's and c's shards are contiguous
    assert files.index("d.parquet") == 0  # no rendered prompt: sorts first, still described


def test_a_named_file_that_is_not_parquet_fails_naming_it(tmp_path: Path) -> None:
    jsonl = tmp_path / "batch.jsonl"
    jsonl.write_text('{"custom_id": "a", "body": {}}\n')
    with pytest.raises(InputError, match=r"batch\.jsonl' is not a Parquet file .*JSON lines"):
        plan_shards(_spec(str(jsonl)))
    csv = tmp_path / "rows.parquet"  # the name does not matter, the bytes do
    csv.write_text("id,text\n1,hello\n")
    with pytest.raises(InputError, match="CSV or text"):
        plan_shards(_spec(str(csv)))


def test_plan_prints_the_effective_shard_sizes(tmp_path: Path) -> None:
    """shard_rows is rounded to row groups: 60 over groups of 56, 44 and 100 rows gives 56/44/100."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from prefixflow.pipeline.cli import main

    rows = docs(200)
    table = pa.Table.from_pylist(rows)
    with pq.ParquetWriter(tmp_path / "in.parquet", table.schema) as writer:
        for a, b in ((0, 56), (56, 100), (100, 200)):
            writer.write_table(table.slice(a, b - a))
    assert [s.num_rows for s in plan_shards(_spec(str(tmp_path / "in.parquet"), shard_rows=60))] == [
        56,
        44,
        100,
    ]
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["plan", "--input", str(tmp_path / "in.parquet"), "--shard-rows", "60"]) == 0
    flat = " ".join(out.getvalue().split())
    assert "shard_rows 60: effective shard sizes 56/44/100 rows" in flat and "(56 rows)" in flat
