"""Many shards of one Parquet file without re-reading its footer for each: the file's row-group index,
kept by whoever reads the file again and again (a lane's Run, planning), and reads of only the bytes of a
shard's row groups.

Without it a one-row shard of a file with 10,000 row groups parsed the whole footer (megabytes) and walked
every row group to find its own, so a run cost O(shards x row groups) (issue 25: 27 ms per shard at 10k
one-row row groups, 52 ms more at plan time). With it: a bisect, and one request for the shard's bytes.
Shards inside one big row group (a 10k-row group split by ``shard_rows``) share its decoded rows.
"""

from __future__ import annotations

import bisect
import io
import threading
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.storage.sources import listed_size, parquet_file
from prefixflow.pipeline.storage.store import Store

DECODED_CACHE_BYTES = 32 * 2**20  # row groups at most this big (uncompressed) stay decoded for the next shard


@dataclass(frozen=True)
class FileIndex:
    """A Parquet file's footer, parsed once: row-group starts and each group's byte range."""

    metadata: pq.FileMetaData
    names: tuple[str, ...]  # top-level columns of its Arrow schema
    starts: tuple[int, ...]  # first row of each row group, then the file's row count
    ranges: tuple[tuple[int, int], ...]  # [first byte, end byte) of each row group's column chunks
    size: int  # the file's size in bytes

    @classmethod
    def of(cls, pf: pq.ParquetFile, size: int) -> FileIndex:
        meta = pf.metadata
        starts, ranges, row = [0], [], 0
        for i in range(meta.num_row_groups):
            group = meta.row_group(i)
            row += group.num_rows
            starts.append(row)
            chunks = [group.column(j) for j in range(group.num_columns)]
            first = [
                c.dictionary_page_offset if c.has_dictionary_page else c.data_page_offset for c in chunks
            ]
            ranges.append(
                (
                    min(first, default=0),
                    max((a + c.total_compressed_size for a, c in zip(first, chunks)), default=0),
                )
            )
        return cls(meta, tuple(pf.schema_arrow.names), tuple(starts), tuple(ranges), size)

    def groups(self, row_start: int, row_end: int) -> range:
        """The row groups that overlap rows [row_start, row_end)."""
        first = bisect.bisect_right(self.starts, row_start) - 1
        last = bisect.bisect_left(self.starts, row_end)
        return range(max(first, 0), min(last, len(self.ranges)))

    def span(self, groups: range) -> tuple[int, int]:
        """[first byte, end byte) covering these row groups' column chunks."""
        return min(self.ranges[g][0] for g in groups), max(self.ranges[g][1] for g in groups)

    def uncompressed_bytes(self, groups: range) -> int:
        return sum(self.metadata.row_group(g).total_byte_size for g in groups)


class _Window(io.RawIOBase):
    """A file of ``size`` bytes of which only [offset, offset + len(data)) was fetched: pyarrow, given the
    footer already parsed, reads only the column chunks of the row groups asked for, all inside it."""

    def __init__(self, data: bytes, offset: int, size: int) -> None:
        super().__init__()
        self._data, self._offset, self._size, self._pos = data, offset, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        self._pos = offset if whence == 0 else self._pos + offset if whence == 1 else self._size + offset
        return self._pos

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        at = self._pos - self._offset
        if at < 0 or at > len(self._data):
            raise OSError(f"internal: read at byte {self._pos} outside the fetched range")
        chunk = self._data[at : at + len(buffer)]
        buffer[: len(chunk)] = chunk
        self._pos += len(chunk)
        return len(chunk)


class InputReader:
    """Reads rows of input files, keeping each file's `FileIndex` after its first read (and the last
    small row groups decoded). One per Run (or per planning pass): files do not change during a run (the
    run record pins their identity). Thread-safe."""

    def __init__(self) -> None:
        self._index: dict[str, FileIndex] = {}
        self._decoded: tuple[str, range, tuple[str, ...], pa.Table] | None = None
        self._lock = threading.Lock()

    def index(self, store: Store, path: str, size: int | None = None) -> FileIndex:
        """The file's index (parsing its footer the first time)."""
        return self._open(store, path, size)[0]

    def read(
        self,
        store: Store,
        path: str,
        row_start: int,
        row_end: int,
        columns: list[str],
        size: int | None = None,
    ) -> pa.Table:
        """Rows [row_start, row_end) of one file, only the needed columns that exist in it. The first read
        of a file is as ``sources.read_rows`` (a small file whole, in one request); later ones fetch only
        the bytes of the row groups they need, in one request. Raises on a corrupt/unreadable file."""
        index, pf = self._open(store, path, size)
        present = tuple(c for c in dict.fromkeys(columns) if c in index.names)
        groups = index.groups(row_start, row_end)
        if not groups:
            return index.metadata.schema.to_arrow_schema().empty_table().select(list(present))
        table = self._decoded_rows(path, groups, present)
        if table is None:
            if pf is None:
                lo, hi = index.span(groups)
                pf = pq.ParquetFile(
                    _Window(store.read_range(path, lo, hi), lo, index.size), metadata=index.metadata
                )
            table = pf.read_row_groups(list(groups), columns=list(present))
            if index.uncompressed_bytes(groups) <= DECODED_CACHE_BYTES:
                with self._lock:
                    self._decoded = (path, groups, present, table)
        first = index.starts[groups.start]
        return table.slice(row_start - first, row_end - row_start)

    def _decoded_rows(self, path: str, groups: range, present: tuple[str, ...]) -> pa.Table | None:
        with self._lock:
            cached = self._decoded
        if cached is not None and cached[0] == path and cached[1] == groups and cached[2] == present:
            return cached[3]
        return None

    def _open(self, store: Store, path: str, size: int | None) -> tuple[FileIndex, pq.ParquetFile | None]:
        """(index, the file opened to parse it, or None when the index was known)."""
        with self._lock:
            known = self._index.get(path)
        if known is not None:
            return known, None
        size = listed_size(path) if size is None else size  # known from the input listing in reads_cached
        size = int(store.fs.size(path)) if size is None else size  # else once per file (S3: one HEAD)
        pf = parquet_file(store, path, size)
        index = FileIndex.of(pf, size)
        with self._lock:
            self._index[path] = index
        return index, pf
