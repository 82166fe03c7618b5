"""The persistent KV tier's files: names, the block format, atomic writes, checked reads, the size cap.

A block file holds one rank's KV of one prompt block. Its name is a 128-bit digest chained over the
namespace and every token from the start of the prompt (``block_digests``), so it names the whole
prefix, not one block's tokens; the namespace (``disk_namespace`` in disk_tier.py) covers everything
that makes KV reusable only by the same model run the same way, so a file is found only by an engine
that would have computed the same bytes. Layout: ``<dir>/<namespace>/<d[:2]>/<digest>.<rank>.kv``.

Format: ``MAGIC``, then a header (namespace, digest, layout version, payload size), the payload (the
block-major host layout of host_store.py: ``[layers, 2, block_size, kv_heads, head_dim]`` of this
rank), and a CRC-32 over header and payload. A write goes to a unique temporary name in the same
folder and is renamed into place (atomic on POSIX), so a reader sees a whole file or none, also when
a writer is killed mid-write or two engines write the same block. A read checks every field and the
checksum; a file that fails is removed and is a miss. No fsync: a killed process loses nothing
written, a power cut may tear a file, which the checksum then catches.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import struct
import threading
import time
import zlib
from array import array
from collections.abc import Iterator, Sequence
from pathlib import Path

MAGIC = b"PFKVBLK1"
LAYOUT_VERSION = 1  # the payload's layout (host_store.py); a change makes old files unreadable, never misread
HEADER = struct.Struct("<8s16s16sIQ")  # magic, namespace, digest, layout version, payload bytes
CRC = struct.Struct("<I")
SUFFIX = ".kv"
TMP_SUFFIX = ".tmp"
STALE_TMP_S = 3600.0  # a temporary file this old belongs to a killed writer: the cap scan removes it
EVICT_TO = 0.9  # the cap scan deletes least recently used files down to this fraction of the cap


def block_digests(
    seed: bytes, token_ids: Sequence[int], start: int, stop: int, block_size: int
) -> list[bytes]:
    """Digests of blocks ``start .. stop - 1`` continuing the chain whose last digest is ``seed`` (the
    namespace for block 0): each is blake2b-128 of the previous digest and the block's token ids."""
    out: list[bytes] = []
    prev = seed
    for i in range(start, stop):
        tokens = array("q", token_ids[i * block_size : (i + 1) * block_size]).tobytes()
        prev = hashlib.blake2b(prev + tokens, digest_size=16).digest()
        out.append(prev)
    return out


def block_path(folder: Path, digest: bytes, rank: int) -> Path:
    name = digest.hex()
    return folder / name[:2] / f"{name}.{rank}{SUFFIX}"


def write_block(path: Path, namespace: bytes, digest: bytes, payload: memoryview) -> int:
    """Write atomically (temporary name, then rename); returns the file's size."""
    head = HEADER.pack(MAGIC, namespace, digest, LAYOUT_VERSION, payload.nbytes)
    crc = zlib.crc32(payload, zlib.crc32(head))
    write_atomic(path, (head, payload, CRC.pack(crc)))
    return HEADER.size + payload.nbytes + CRC.size


def write_atomic(path: Path, parts: Sequence[bytes | memoryview]) -> None:
    """Write ``parts`` to a unique temporary name beside ``path``, then rename it into place."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(
        f".{path.name}.{os.getpid()}.{threading.get_ident()}.{secrets.token_hex(4)}{TMP_SUFFIX}"
    )
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_block(path: Path, namespace: bytes, digest: bytes, nbytes: int) -> tuple[bytearray, str | None]:
    """The file's bytes and None when it is whole and is this block; else why not ("missing",
    "corrupt: ..."). A corrupt file is removed. The payload is ``buf[HEADER.size : HEADER.size + nbytes]``."""
    size = HEADER.size + nbytes + CRC.size
    buf = bytearray(size)
    try:
        with open(path, "rb") as f:
            got = f.readinto(buf)
            extra = f.read(1)
    except FileNotFoundError:
        return buf, "missing"
    except OSError as exc:
        return buf, f"unreadable: {exc}"
    problem = _check(buf, got, bool(extra), namespace, digest, nbytes)
    if problem is not None:
        path.unlink(missing_ok=True)  # never read again; the block is recomputed and written anew
        return buf, f"corrupt: {problem}"
    try:
        os.utime(path)  # the cap's LRU order is by modification time: a read makes it recent
    except OSError:
        pass  # another engine evicted it meanwhile: this read still holds the whole file
    return buf, None


def _check(buf: bytearray, got: int, extra: bool, namespace: bytes, digest: bytes, nbytes: int) -> str | None:
    if got != len(buf) or extra:
        return f"{got}{'+' if extra else ''} bytes, expected {len(buf)}"
    magic, ns, dg, version, size = HEADER.unpack_from(buf)
    if magic != MAGIC or version != LAYOUT_VERSION:
        return "not a prefixflow KV block of this layout version"
    if ns != namespace or dg != digest or size != nbytes:
        return "header names another block"
    (crc,) = CRC.unpack_from(buf, len(buf) - CRC.size)
    if zlib.crc32(memoryview(buf)[: len(buf) - CRC.size]) != crc:
        return "checksum mismatch"
    return None


def _files(root: Path) -> Iterator[os.DirEntry[str]]:
    try:
        entries = list(os.scandir(root))
    except OSError:
        return
    for entry in entries:
        try:
            if entry.is_dir(follow_symlinks=False):
                yield from _files(Path(entry.path))
            elif entry.is_file(follow_symlinks=False):
                yield entry
        except OSError:
            continue


def directory_bytes(root: Path) -> int:
    return sum(_stat(e)[1] for e in _files(root) if e.name.endswith(SUFFIX))


def enforce_cap(root: Path, cap_bytes: int) -> int:
    """Delete the least recently used block files (every namespace) until the directory holds at
    most ``EVICT_TO`` x ``cap_bytes``, and stale temporary files; returns the bytes left. Safe beside
    other engines doing the same: a file already gone is skipped, a reader holding it open keeps it."""
    now = time.time()
    files: list[tuple[float, int, str]] = []
    for entry in _files(root):
        mtime, size = _stat(entry)
        if entry.name.endswith(TMP_SUFFIX) and now - mtime > STALE_TMP_S:
            _unlink(entry.path)
        elif entry.name.endswith(SUFFIX):
            files.append((mtime, size, entry.path))
    total = sum(size for _, size, _ in files)
    if total <= cap_bytes:
        return total
    files.sort()
    for _, size, path in files:
        if total <= cap_bytes * EVICT_TO:
            break
        _unlink(path)
        total -= size
    return total


def _stat(entry: os.DirEntry[str]) -> tuple[float, int]:
    try:
        st = entry.stat(follow_symlinks=False)
    except OSError:
        return 0.0, 0
    return st.st_mtime, st.st_size


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
