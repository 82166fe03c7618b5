"""Input discovery and reading: Parquet files, folders and globs on any fsspec filesystem."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from prefixflow.pipeline.errors import InputError
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.storage.store import Store

_GLOB_CHARS = "*?["


@dataclass(frozen=True)
class InputFile:
    """One Parquet file: its fsspec path and its id-stable name relative to the input root."""

    path: str
    relpath: str


def list_inputs(url: str, cfg: StorageConfig) -> tuple[Store, list[InputFile]]:
    """Expand a file, folder or glob into sorted Parquet files; fail with a message that says what to fix."""
    try:
        store = Store.open(url, cfg)
    except Exception as exc:
        raise InputError(f"cannot open input {url!r}: {type(exc).__name__}: {exc}") from exc
    fs, root = store.fs, store.root
    fs.invalidate_cache()  # fsspec instances are shared per process: an old listing would hide changed files
    try:
        if any(c in root for c in _GLOB_CHARS):
            base = root[: min(root.find(c) for c in _GLOB_CHARS if c in root)].rsplit("/", 1)[0]
            paths = [p for p in fs.glob(root) if not fs.isdir(p)]
        elif fs.isdir(root):
            base = root
            paths = [p for p in fs.find(root) if p.endswith((".parquet", ".pq", ".parq"))]
        elif fs.exists(root):
            base = root.rsplit("/", 1)[0]
            paths = [root]
            check_parquet_magic(store, root, url)
        else:
            raise InputError(
                f"input {url!r} does not exist; pass a Parquet file, a folder of them, or a glob"
            )
    except InputError:
        raise
    except Exception as exc:
        raise InputError(f"cannot list input {url!r}: {type(exc).__name__}: {exc}") from exc
    paths = sorted(p for p in paths if not p.rsplit("/", 1)[-1].startswith(("_", ".")))
    if not paths:
        raise InputError(f"no Parquet files found at {url!r} (looked for *.parquet, *.pq, *.parq)")
    files = [InputFile(p, p[len(base) :].lstrip("/") if p.startswith(base) else p) for p in paths]
    return store, files


PARQUET_MAGIC = b"PAR1"


def check_parquet_magic(store: Store, path: str, url: str) -> None:
    """A file named as the input must start like Parquet; say what it looks like instead.

    Only the one file a user named is checked this way (4 bytes): a wrong format there is a wrong
    command. A broken file inside a folder still fails only its own shard at run time."""
    try:
        with store.fs.open(path, "rb") as f:
            head = f.read(64)
    except Exception as exc:
        raise InputError(f"cannot read input {url!r}: {type(exc).__name__}: {exc}") from exc
    if head.startswith(PARQUET_MAGIC):
        return
    raise InputError(
        f"input {url!r} is not a Parquet file ({_looks_like(head)}); prefixflow reads Parquet files, "
        "folders and globs of them, and OpenAI Batch JSONL files (.jsonl with custom_id/method/url/body)"
    )


def _looks_like(head: bytes) -> str:
    text = head.lstrip()
    if not text:
        return "it is empty"
    if text[:1] in (b"{", b"["):
        return f"it starts with {head[:24]!r}: JSON or JSON lines"
    if b"," in head.split(b"\n", 1)[0] and head.isascii():
        return f"it starts with {head[:24]!r}: CSV or text"
    return f"it starts with {head[:8]!r}, not with the Parquet magic bytes PAR1"


def file_identity(store: Store, path: str) -> dict[str, str | int | None]:
    """What pins one input file's contents, recorded in the run record so a resume over changed input is
    refused: the size and a digest of the Parquet footer (it holds every row group's offsets, sizes and
    statistics, so an edit that keeps the size still changes it), plus S3's ETag and version id. The
    footer digest is ``None`` for a file whose footer cannot be read (it fails its own shard anyway)."""
    store.fs.invalidate_cache(path)
    info = store.fs.info(path)
    size = int(info.get("size") or 0)
    identity: dict[str, str | int | None] = {"size": size}
    for key in ("ETag", "VersionId"):
        if info.get(key):
            identity[key.lower()] = str(info[key]).strip('"')
    if store.is_s3 and "etag" in identity:
        return identity  # the ETag already changes with the content; no second read
    try:
        with store.fs.open(path, "rb") as f:
            f.seek(max(size - 8, 0))
            tail = f.read(8)
            length = int.from_bytes(tail[:4], "little")
            if tail[4:] != PARQUET_MAGIC or length + 8 > size:
                raise ValueError("no Parquet footer")
            f.seek(size - 8 - length)
            identity["footer_sha256"] = hashlib.sha256(f.read(length)).hexdigest()[:32]
    except Exception:  # noqa: BLE001 - unreadable: its shard fails; the size still pins it
        identity["footer_sha256"] = None
    return identity


WHOLE_FILE_BYTES = (
    4 * 2**20
)  # a file this small is read by one request (S3: one GET instead of HEAD + ranges)


def parquet_file(store: Store, path: str, size: int | None = None) -> pq.ParquetFile:
    """The file, opened for reading; ``size`` (its known size, from the run record) saves asking the
    store for it, and a small file is then read whole in one request."""
    if size is not None and 0 < size <= WHOLE_FILE_BYTES:
        return pq.ParquetFile(pa.BufferReader(store.read_bytes(path)))
    return pq.ParquetFile(store.fs.open(path, "rb", **({"size": size} if size else {})))


def read_rows(
    store: Store, path: str, row_start: int, row_end: int, columns: list[str], size: int | None = None
) -> pa.Table:
    """Rows [row_start, row_end) of one file, only the needed columns that exist in it.

    Reads only the row groups that overlap the range. Raises on a corrupt/unreadable file.
    """
    pf = parquet_file(store, path, size)
    present = [c for c in dict.fromkeys(columns) if c in pf.schema_arrow.names]
    groups: list[int] = []
    offset, first_offset = 0, 0
    for i in range(pf.metadata.num_row_groups):
        n = pf.metadata.row_group(i).num_rows
        if offset < row_end and offset + n > row_start:
            if not groups:
                first_offset = offset
            groups.append(i)
        offset += n
    if not groups:
        return pf.schema_arrow.empty_table().select(present)
    table = pf.read_row_groups(groups, columns=present)
    return table.slice(row_start - first_offset, row_end - row_start)
