"""Storage over fsspec with the three primitives exactly-once output needs.

- ``write_atomic``: a reader sees the whole object or nothing (local: temp file + rename; S3: one PUT).
- ``create_exclusive``: the commit point; only one writer can ever create a given marker (local:
  hard-link of a complete temp file, which fails if the name exists; S3: PUT with ``If-None-Match: *``).
- ``copy``: publish a staged part under its final name (local: hard link; S3: server-side copy).
"""

from __future__ import annotations

import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.core import url_to_fs

from prefixflow.pipeline.config import StorageConfig


def storage_options(url: str, cfg: StorageConfig) -> dict[str, Any]:
    """fsspec options for ``url``: the configured ones, plus ``endpoint_url`` for S3-like stores."""
    opts = dict(cfg.options)
    if cfg.endpoint_url and url.startswith(("s3://", "s3a://")):
        client_kwargs = dict(opts.get("client_kwargs") or {})
        client_kwargs.setdefault("endpoint_url", cfg.endpoint_url)
        opts["client_kwargs"] = client_kwargs
    return opts


@dataclass
class Store:
    """A filesystem plus the root it was opened at; paths passed to methods are full fsspec paths."""

    fs: fsspec.AbstractFileSystem
    root: str

    @classmethod
    def open(cls, url: str, cfg: StorageConfig) -> Store:
        fs, root = url_to_fs(url, **storage_options(url, cfg))
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
        self.fs.invalidate_cache(path)
        return bool(self.fs.exists(path))

    def read_bytes(self, path: str) -> bytes:
        return bytes(self.fs.cat_file(path))

    def list_files(self, path: str) -> list[str]:
        """All files below ``path`` (recursive), sorted; empty when the folder does not exist."""
        self.fs.invalidate_cache(path)
        try:
            found = self.fs.find(path)
        except FileNotFoundError:
            return []
        return sorted(p for p in found if not p.rsplit("/", 1)[-1].startswith(".tmp-"))

    def write_atomic(self, path: str, data: bytes) -> None:
        if self.is_local:
            tmp = self._local_tmp(path, data)
            os.replace(tmp, path)
        else:
            self.fs.pipe_file(path, data)

    def create_exclusive(self, path: str, data: bytes) -> bool:
        """Create ``path`` with ``data`` unless it exists. True if we created it, False if it was there."""
        if self.is_local:
            tmp = self._local_tmp(path, data)
            try:
                os.link(tmp, path)
                return True
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
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
            os.makedirs(os.path.dirname(dst), exist_ok=True)
            try:
                os.link(src, dst)
            except FileExistsError:
                pass
            except OSError:  # filesystems without hard links
                tmp = f"{os.path.dirname(dst)}/.tmp-{uuid.uuid4().hex}"
                shutil.copyfile(src, tmp)
                os.replace(tmp, dst)
        else:
            self.fs.copy(src, dst)

    def remove_tree(self, path: str) -> None:
        self.fs.invalidate_cache(path)
        try:
            self.fs.rm(path, recursive=True)
        except FileNotFoundError:
            pass

    def _local_tmp(self, path: str, data: bytes) -> str:
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        tmp = f"{folder}/.tmp-{uuid.uuid4().hex}"
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        return tmp


def _protocols(fs: fsspec.AbstractFileSystem) -> tuple[str, ...]:
    proto = fs.protocol
    return (proto,) if isinstance(proto, str) else tuple(proto)
