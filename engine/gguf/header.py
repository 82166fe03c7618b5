"""Where a GGUF file's header ends, found by skipping over it (no arrays built, no gguf import).

The header holds everything but the tensor data: the hyperparameters, the whole tokenizer, the chat
template, and the name, type, shape and offset of every tensor. Hashing it whole names all of that;
``gguf.GGUFReader`` would build numpy arrays for every vocabulary entry (seconds for a 49k
vocabulary) just to find the same offset.
"""

from __future__ import annotations

import mmap
import struct
from pathlib import Path

# GGUF value types -> byte size of fixed-size values (8 = string, 9 = array are variable).
_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_STRING, _ARRAY = 8, 9


class GGUFHeaderError(ValueError):
    """The file is not a GGUF file this engine can read."""


def gguf_header_size(path: Path) -> int:
    """Bytes from the start of the file to the end of the tensor-info table (little-endian GGUF v2/v3)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            return _scan(buf)
        except (struct.error, IndexError) as exc:
            raise GGUFHeaderError(f"{path}: truncated or corrupt GGUF header ({exc})") from None


def _scan(buf: mmap.mmap) -> int:
    if buf[:4] != b"GGUF":
        raise GGUFHeaderError("not a GGUF file (missing the 'GGUF' magic bytes)")
    (version,) = struct.unpack_from("<I", buf, 4)
    if version not in (2, 3):
        raise GGUFHeaderError(f"GGUF version {version} is not supported (2 or 3)")
    n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
    pos = 24
    for _ in range(n_kv):
        pos = _skip_string(buf, pos)  # key
        (vtype,) = struct.unpack_from("<I", buf, pos)
        pos = _skip_value(buf, pos + 4, vtype)
    for _ in range(n_tensors):
        pos = _skip_string(buf, pos)  # name
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        pos += 4 + 8 * n_dims + 4 + 8  # dims, type, offset
    if pos > len(buf):
        raise IndexError("header runs past the end of the file")
    return pos


def _skip_string(buf: mmap.mmap, pos: int) -> int:
    n: int = struct.unpack_from("<Q", buf, pos)[0]
    return pos + 8 + n


def _skip_value(buf: mmap.mmap, pos: int, vtype: int) -> int:
    if vtype in _FIXED:
        return pos + _FIXED[vtype]
    if vtype == _STRING:
        return _skip_string(buf, pos)
    if vtype == _ARRAY:
        item_type: int
        count: int
        item_type, count = struct.unpack_from("<IQ", buf, pos)
        pos += 12
        if item_type in _FIXED:
            return pos + count * _FIXED[item_type]
        for _ in range(count):
            pos = _skip_value(buf, pos, item_type)
        return pos
    raise GGUFHeaderError(f"unknown GGUF value type {vtype}")


def gguf_tensor_table(path: Path) -> list[tuple[str, tuple[int, ...], int]]:
    """``(name, dims fastest-first, GGML type id)`` of every tensor, read from the header alone."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            end = _scan(buf)
            (n_tensors, n_kv) = struct.unpack_from("<QQ", buf, 8)
            pos = 24
            for _ in range(n_kv):
                pos = _skip_string(buf, pos)
                (vtype,) = struct.unpack_from("<I", buf, pos)
                pos = _skip_value(buf, pos + 4, vtype)
            table = []
            for _ in range(n_tensors):
                (n,) = struct.unpack_from("<Q", buf, pos)
                name = bytes(buf[pos + 8 : pos + 8 + n]).decode("utf-8")
                pos += 8 + n
                (n_dims,) = struct.unpack_from("<I", buf, pos)
                dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
                (ggml_type,) = struct.unpack_from("<I", buf, pos + 4 + 8 * n_dims)
                pos += 4 + 8 * n_dims + 4 + 8
                table.append((name, tuple(int(d) for d in dims), int(ggml_type)))
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise GGUFHeaderError(f"{path}: truncated or corrupt GGUF header ({exc})") from None
    assert pos == end
    return table
