"""Issue 25 item 4: many shards of one Parquet file. The footer is parsed once per file (a Run's or a
planning pass's InputReader), a later shard fetches only its row groups' bytes in one request, and the
rows read are exactly those of a whole-table slice. Before, every one-row shard of a file with N row groups
read the whole file and walked its N-entry footer: O(N) per shard, O(N^2) per run."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from prefixflow.pipeline import describe_shards, load_job, plan_shards
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.storage.parquet_index import InputReader
from prefixflow.pipeline.storage.store import Store


def _file(path: Path, rows: int, group: int) -> pa.Table:
    table = pa.table(
        {"id": [f"r{i}" for i in range(rows)], "text": [f"item {i} " * (i % 5 + 1) for i in range(rows)]}
    )
    pq.write_table(table, path, row_group_size=group)
    return table


class _Counted(Store):
    """A local Store that counts its reads and the bytes they return."""

    reads = 0
    fetched = 0

    def read_bytes(self, path: str) -> bytes:
        data = super().read_bytes(path)
        self.reads, self.fetched = self.reads + 1, self.fetched + len(data)
        return data

    def read_range(self, path: str, start: int, end: int) -> bytes:
        data = super().read_range(path, start, end)
        self.reads, self.fetched = self.reads + 1, self.fetched + len(data)
        return data


def _store(root: Path) -> _Counted:
    base = Store.open(str(root), StorageConfig())
    return _Counted(base.fs, base.root)


@pytest.mark.parametrize("group", [1, 7, 1000])
def test_rows_read_equal_the_slice_of_the_whole_table(tmp_path: Path, group: int) -> None:
    table = _file(tmp_path / "f.parquet", 60, group)
    path, size = str(tmp_path / "f.parquet"), (tmp_path / "f.parquet").stat().st_size
    reader, store = InputReader(), _store(tmp_path)
    rng = random.Random(group)
    ranges = [(0, 60), (59, 60), (0, 1), (6, 8), (13, 29)] + [
        tuple(sorted(rng.sample(range(61), 2))) for _ in range(30)
    ]
    for start, end in ranges:
        got = reader.read(store, path, start, end, ["text", "id", "missing"], size)
        assert got.column_names == ["text", "id"]
        assert got.to_pylist() == table.slice(start, end - start).select(["text", "id"]).to_pylist(), (
            start,
            end,
        )
    assert reader.read(store, path, 60, 60, ["id"], size).num_rows == 0


def test_one_row_shards_of_one_file_fetch_only_their_own_bytes(tmp_path: Path) -> None:
    rows = 300
    _file(tmp_path / "f.parquet", rows, 1)  # 300 row groups: a footer much bigger than any one row
    path, size = str(tmp_path / "f.parquet"), (tmp_path / "f.parquet").stat().st_size
    reader, store = InputReader(), _store(tmp_path)
    for i in range(rows):
        assert reader.read(store, path, i, i + 1, ["id"], size).column("id").to_pylist() == [f"r{i}"]
    # one request per shard; the file is fetched whole once (its footer), then ~a row's bytes per shard
    assert store.reads == rows
    assert store.fetched < 2 * size, (store.fetched, size)  # before: rows x size


def test_planning_describes_every_shard_of_one_file_from_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "in").mkdir()
    _file(tmp_path / "in" / "f.parquet", 200, 1000)  # one row group, cut into 200 shards
    spec = load_job(
        str(tmp_path / "in"), str(tmp_path / "out"), "tiny", {"prompt_column": "text"}, shard_rows=1
    )
    shards = plan_shards(spec)
    assert len(shards) == 200
    reads: list[str] = []
    original = LocalFileSystem.open  # every read goes through it (cat_file too)

    def counted(self: LocalFileSystem, path: str, *a: Any, **k: Any) -> Any:
        reads.append(path)
        return original(self, path, *a, **k)

    monkeypatch.setattr(LocalFileSystem, "open", counted)
    infos = describe_shards(spec, shards)
    assert [i.shard.shard_id for i in infos] == [s.shard_id for s in shards]
    assert all(f"item {s.row_start} " in i.prefix_key for s, i in zip(shards, infos))
    assert len(reads) <= 2, len(reads)  # before: 2 per shard (its footer twice, its row group once)
