"""Storage over fsspec with the three primitives exactly-once output needs.

- ``write_atomic``: a reader sees the whole object or nothing (local: temp file + rename; S3: one PUT).
- ``create_exclusive``: the commit point; only one writer can ever create a given marker (local:
  hard-link of a complete temp file, which fails if the name exists; S3: PUT with ``If-None-Match: *``).
- ``copy``: publish a staged part under its final name (local: hard link; S3: server-side copy).
"""

from __future__ import annotations

import copy
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.storage import slow

TEMP_PREFIX = ".tmp-"  # local writes go through <folder>/.tmp-<random>, then a rename or a link


# S3 calls time out and retry a bounded number of times, so a stalled endpoint fails the command within
# about a minute and a half (s3fs' defaults, 15 s per read x botocore's 5 attempts x s3fs' own 5 retries,
# kept a run silent for over 5 minutes). The botocore ones can be overridden with
# --storage-option config_kwargs='{read_timeout: 60, retries: {max_attempts: 5}}'.
S3_TIMEOUTS: dict[str, Any] = {
    "connect_timeout": 5,
    "read_timeout": 20,
    "retries": {"max_attempts": 2, "mode": "standard"},
}
S3_CALL_RETRIES = 2  # s3fs' own retries of a timed-out call (its default 5), on top of botocore's attempts


def storage_options(url: str, cfg: StorageConfig) -> dict[str, Any]:
    """fsspec options for ``url``: the configured ones, plus ``endpoint_url`` and bounded timeouts and
    retries (``S3_TIMEOUTS``, unless set) for S3-like stores."""
    opts = dict(cfg.options)
    if url.startswith(("s3://", "s3a://")):
        if cfg.endpoint_url:
            client_kwargs = dict(opts.get("client_kwargs") or {})
            client_kwargs.setdefault("endpoint_url", cfg.endpoint_url)
            opts["client_kwargs"] = client_kwargs
        # deep copies: botocore's Config rewrites a `retries` dict in place (max_attempts ->
        # total_max_attempts), which would change the shared defaults for every later store
        opts["config_kwargs"] = {
            **copy.deepcopy(S3_TIMEOUTS),
            **copy.deepcopy(dict(opts.get("config_kwargs") or {})),
        }
    return opts


@dataclass
class Store:
    """A filesystem plus the root it was opened at; paths passed to methods are full fsspec paths."""

    fs: fsspec.AbstractFileSystem
    root: str

    @classmethod
    def open(cls, url: str, cfg: StorageConfig) -> Store:
        fs, root = url_to_fs(url, **storage_options(url, cfg))
        if {"s3", "s3a"} & set(_protocols(fs)):
            if getattr(fs, "retries", 0) > S3_CALL_RETRIES:
                fs.retries = S3_CALL_RETRIES
            slow.instrument(fs)  # a stalled call shows in the progress output (storage/slow.py)
        return cls(fs, root.rstrip("/") if root != "/" else root)

    @property
    def is_local(self) -> bool:
        return "file" in _protocols(self.fs)

    @property
    def is_s3(self) -> bool:
        return bool({"s3", "s3a"} & set(_protocols(self.fs)))

    def join(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *[p.strip("/") for p in parts]])

    def url(self, path: str) -> str:
        """A URL other readers (polars, duckdb) understand for a path in this store."""
        return self.fs.unstrip_protocol(path) if not self.is_local else path

    def exists(self, path: str) -> bool:
        """Whether the file ``path`` exists. On S3 one HEAD: s3fs' ``exists`` adds a listing for every
        missing key (to find a "folder" of that name), and every caller here asks about an object."""
        self.fs.invalidate_cache(path)
        if self.is_s3:
            bucket, key, _ = self.fs.split_path(path)
            try:
                self.fs.call_s3("head_object", Bucket=bucket, Key=key)
                return True
            except FileNotFoundError:
                return False
        return bool(self.fs.exists(path))

    def listing(self, path: str) -> dict[str, dict[str, Any]]:
        """Every file and folder below ``path`` (recursive) with its fsspec details (``type``, size,
        mtime / LastModified), from one listing (on S3 one request per 1,000 keys; its folders are
        inferred from the keys); empty when the folder does not exist."""
        self.fs.invalidate_cache(path)
        parent, _, name = path.rstrip("/").rpartition("/")
        try:
            if self.is_s3 and parent.strip("/"):
                # a key prefix: s3fs follows an empty listing of a folder with a HEAD and another listing
                found = self.fs.find(parent, prefix=name + "/", detail=True, withdirs=True)
            else:
                found = self.fs.find(path, detail=True, withdirs=True)
        except FileNotFoundError:
            return {}
        return {
            p: info for p, info in sorted(found.items()) if not p.rsplit("/", 1)[-1].startswith(TEMP_PREFIX)
        }

    def read_bytes(self, path: str) -> bytes:
        """The whole file; on S3 one GET (s3fs would first HEAD it for its size to split big reads)."""
        if self.is_s3:
            return bytes(self.fs.cat_file(path, max_concurrency=1))
        return bytes(self.fs.cat_file(path))

    def read_range(self, path: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of a file, in one request (S3: one ranged GET)."""
        if self.is_s3:
            return bytes(self.fs.cat_file(path, start=start, end=end, max_concurrency=1))
        return bytes(self.fs.cat_file(path, start=start, end=end))

    def list_files(self, path: str) -> list[str]:
        """All files below ``path`` (recursive), sorted; empty when the folder does not exist."""
        self.fs.invalidate_cache(path)
        try:
            found = self.fs.find(path)
        except FileNotFoundError:
            return []
        return sorted(p for p in found if not p.rsplit("/", 1)[-1].startswith(TEMP_PREFIX))

    def write_atomic(self, path: str, data: bytes) -> None:
        if not self.is_local:
            self.fs.pipe_file(path, data)
            return
        for last in (False, False, True):  # a concurrent cleanup may remove the folder under us: retry
            try:
                os.replace(self._local_tmp(path, data), path)
                return
            except FileNotFoundError:
                if last:
                    raise

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` unless it exists. True if we created it, False if it was there."""
        if self.is_local:
            for last in (False, False, True):
                try:
                    tmp = self._local_tmp(path, data)
                    try:
                        os.link(tmp, path)
                        return True
                    finally:
                        os.unlink(tmp)
                except FileExistsError:
                    return False
                except FileNotFoundError:  # the folder was removed under us: retry
                    if last:
                        raise
        if self.is_s3:
            try:  # s3fs sends IfNoneMatch="*"; S3 (and moto's server) answer 412 -> FileExistsError
                self.fs.pipe_file(path, data, mode="create")
                return True
            except FileExistsError:
                return False
        # Other stores have no exclusive create in fsspec: check-then-write (documented race window).
        if self.exists(path):
            return False
        self.fs.pipe_file(path, data)
        return True

    def copy(self, src: str, dst: str) -> None:
        """Place the bytes of ``src`` at ``dst`` (idempotent: same bytes each time)."""
        if self.is_local:
            _ensure_dir(os.path.dirname(dst))
            try:
                os.link(src, dst)
            except FileExistsError:
                pass
            except OSError:  # filesystems without hard links
                tmp = f"{os.path.dirname(dst)}/{TEMP_PREFIX}{uuid.uuid4().hex}"
                shutil.copyfile(src, tmp)
                os.replace(tmp, dst)
        elif self.is_s3:  # one CopyObject: fs.copy would first HEAD the source and probe dst for a folder
            (b1, k1, _), (b2, k2, _) = self.fs.split_path(src), self.fs.split_path(dst)
            self.fs.call_s3("copy_object", Bucket=b2, Key=k2, CopySource={"Bucket": b1, "Key": k1})
            self.fs.invalidate_cache(dst)
        else:
            self.fs.copy(src, dst)

    def list_dir(self, path: str) -> list[str]:
        """Names directly below ``path`` (files and folders), sorted; empty when it does not exist."""
        self.fs.invalidate_cache(path)
        try:
            entries = self.fs.ls(path, detail=False)
        except (FileNotFoundError, NotADirectoryError):
            return []
        base = path.rstrip("/")
        found = (str(e).rstrip("/") for e in entries)
        return sorted({e[len(base) + 1 :].split("/")[0] for e in found if e.startswith(base + "/")})

    def remove(self, path: str) -> None:
        """Delete one file; a missing file is fine."""
        try:
            self.fs.rm_file(path)
        except FileNotFoundError:
            pass

    def remove_files(self, paths: list[str]) -> None:
        """Delete these files in as few requests as the store allows (S3: one DeleteObjects per 1,000
        keys); missing ones are fine."""
        if not paths:
            return
        if not self.is_s3:
            for path in paths:
                self.remove(path)
            return
        try:
            self.fs.rm(paths)
        except FileNotFoundError:
            pass

    def remove_tree(self, path: str, best_effort: bool = False) -> None:
        """Delete ``path`` and everything below it; a missing path is fine. ``best_effort`` (cleanup of
        leftovers another process may still be writing into) never raises: what stays is removed later."""
        self.fs.invalidate_cache(path)
        try:
            if self.is_local and best_effort:
                shutil.rmtree(path, ignore_errors=True)
            else:
                self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass
        except OSError:
            if not best_effort:
                raise

    def _local_tmp(self, path: str, data: bytes) -> str:
        folder = os.path.dirname(path)
        _ensure_dir(folder)
        tmp = f"{folder}/{TEMP_PREFIX}{uuid.uuid4().hex}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:  # disk full, read-only, interrupted: leave no partial temp file behind
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return tmp

    def remove_temp_files(self, skip: tuple[str, ...] = ()) -> int:
        """Delete the ``.tmp-*`` files a killed or failed write left anywhere below the root (local
        stores only; S3 writes are whole PUTs), except under the top folders named in ``skip``. Call it
        only while no other process writes the root: their temp files would go too. Returns how many."""
        if not self.is_local or not os.path.isdir(self.root):
            return 0
        removed = 0
        for folder, dirs, files in os.walk(self.root):
            if folder == self.root:
                dirs[:] = [d for d in dirs if d not in skip]
            for name in files:
                if name.startswith(TEMP_PREFIX):
                    try:
                        os.unlink(os.path.join(folder, name))
                        removed += 1
                    except FileNotFoundError:
                        pass
        return removed


def modified_at(info: dict[str, Any]) -> float | None:
    """The storage's own timestamp of a listed file (epoch seconds): the local ``mtime``, S3's
    ``LastModified``; None when the store reports neither."""
    value = info.get("mtime", info.get("LastModified"))
    if value is None:
        return None
    if hasattr(value, "timestamp"):
        return float(value.timestamp())
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _ensure_dir(folder: str) -> None:
    """``os.makedirs(folder, exist_ok=True)``, also while another process removes a parent: makedirs then
    raises FileExistsError for a folder that vanished between its own mkdir and its check."""
    for _ in range(5):
        try:
            os.makedirs(folder, exist_ok=True)
            return
        except FileExistsError:
            if os.path.exists(folder) and not os.path.isdir(folder):
                raise
    os.makedirs(folder, exist_ok=True)


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
