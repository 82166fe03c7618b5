"""Input discovery and reading: Parquet files, folders and globs on any fsspec filesystem."""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

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
            found = fs.find(root, detail=True)
            _remember_sizes({p: i.get("size") for p, i in found.items()})
            paths = [p for p in found if p.endswith((".parquet", ".pq", ".parq"))]
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
    footer digest is ``None`` for a file whose footer cannot be read (it fails its own shard anyway).
    Inside ``reads_cached`` it is computed once per file, and a local file already read whole is not
    asked again (same bytes, same digest)."""
    scope = _scope.get()
    if scope is not None and path in scope.identities:
        return dict(scope.identities[path])
    identity = _identity(store, path)
    if scope is not None:
        scope.identities[path] = dict(identity)
    return identity


def _identity(store: Store, path: str) -> dict[str, str | int | None]:
    cached = _cached(path)
    if cached is not None and cached.data is not None and store.is_local:
        return {"size": len(cached.data), "footer_sha256": _footer_digest(cached.data)}
    store.fs.invalidate_cache(path)
    info = store.fs.info(path)
    size = int(info.get("size") or 0)
    identity: dict[str, str | int | None] = {"size": size}
    for key in ("ETag", "VersionId"):
        if info.get(key):
            identity[key.lower()] = str(info[key]).strip('"')
    if store.is_s3 and "etag" in identity:
        return identity  # the ETag already changes with the content; no second read
    if cached is not None and cached.data is not None and len(cached.data) == size:
        identity["footer_sha256"] = _footer_digest(cached.data)
        return identity
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
    store for it, and a small file is then read whole in one request.

    Inside ``reads_cached`` (one command's planning and run) each file is read once: a small file's
    bytes, or a larger file's footer, are kept and reused by every later open of it (plan, schemas,
    identities, the id index, the advisor's sample, the shard's own read)."""
    scope = _scope.get()
    if scope is None:
        return _open(store, path, size)[0]
    hit = scope.files.get(path)
    if hit is not None and (size is None or size == hit.size):
        if hit.data is not None:
            return pq.ParquetFile(pa.BufferReader(hit.data))
        return pq.ParquetFile(store.fs.open(path, "rb", size=hit.size), metadata=hit.metadata)
    size = size if size is not None else scope.sizes.get(path)
    pf, data = _open(store, path, size)
    if data is not None and scope.bytes_kept + len(data) <= CACHE_BYTES:
        scope.bytes_kept += len(data)
        scope.files[path] = _Cached(len(data), data, pf.metadata)
    elif size is not None:
        scope.files[path] = _Cached(size, None, pf.metadata)
    return pf


def _open(store: Store, path: str, size: int | None) -> tuple[pq.ParquetFile, bytes | None]:
    """The file, and its bytes when it was small enough to read whole."""
    if size is not None and 0 < size <= WHOLE_FILE_BYTES:
        data = store.read_bytes(path)
        return pq.ParquetFile(pa.BufferReader(data)), data
    return pq.ParquetFile(store.fs.open(path, "rb", **({"size": size} if size else {}))), None


CACHE_BYTES = 64 * 2**20  # what one command keeps of small input files' bytes (footers are always kept)


@dataclass
class _Cached:
    size: int
    data: bytes | None  # the whole file, when small
    metadata: pq.FileMetaData


@dataclass
class _Scope:
    files: dict[str, _Cached] = field(default_factory=dict)
    sizes: dict[str, int] = field(default_factory=dict)  # from the input listing
    identities: dict[str, dict[str, str | int | None]] = field(default_factory=dict)  # file_identity's
    bytes_kept: int = 0


_scope: contextvars.ContextVar[_Scope | None] = contextvars.ContextVar("prefixflow_input_reads", default=None)


@contextmanager
def reads_cached() -> Iterator[None]:
    """One command's reads of its input files, each file read once (see ``parquet_file``). Only around a
    single command: a file edited inside the scope is not seen again there (the next command reads it
    afresh, and the run record's identities catch the change)."""
    token = _scope.set(_scope.get() or _Scope())
    try:
        yield
    finally:
        _scope.reset(token)


def _remember_sizes(sizes: dict[str, Any]) -> None:
    scope = _scope.get()
    if scope is not None:
        scope.sizes.update({p: int(v) for p, v in sizes.items() if isinstance(v, int)})


def listed_size(path: str) -> int | None:
    """The file's size as the input listing of this ``reads_cached`` scope saw it, or None."""
    scope = _scope.get()
    return scope.sizes.get(path) if scope is not None else None


def _cached(path: str) -> _Cached | None:
    scope = _scope.get()
    return scope.files.get(path) if scope is not None else None


def _footer_digest(data: bytes) -> str | None:
    size = len(data)
    length = int.from_bytes(data[-8:-4], "little") if size >= 8 else 0
    if size < 8 or data[-4:] != PARQUET_MAGIC or length + 8 > size:
        return None
    return hashlib.sha256(data[size - 8 - length : size - 8]).hexdigest()[:32]


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
