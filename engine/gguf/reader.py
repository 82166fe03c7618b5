"""``GGUFFile``: a GGUF file's metadata and tensors, read the way ``gguf.GGUFReader`` reads them, minus
its cost.

``GGUFReader`` builds two numpy views per element of every metadata array, so the 49k-token vocabulary
and 49k merges of the embedded SmolLM2 cost 3.5 CPU-seconds of its 7.7-second load (benchmarks/RESULTS.md
issue 24, "Fourth round"), although a load reads a dozen scalars and never the vocabulary (the tokenizer
is cached). Here a metadata value is decoded when it is asked for, fixed-size arrays in one
``np.frombuffer``, and tensors are the same ``gguf.ReaderTensor`` records (memmapped data, GGUF dims
fastest-first, block types as ``[rows, bytes per row]`` uint8) that ``GGUFReader`` makes.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType, ReaderField, ReaderTensor
from gguf.quants import quant_shape_to_byte_shape

from prefixflow.engine.gguf.header import GGUFHeaderError

_SCALAR = {
    GGUFValueType.UINT8: "<u1",
    GGUFValueType.INT8: "<i1",
    GGUFValueType.UINT16: "<u2",
    GGUFValueType.INT16: "<i2",
    GGUFValueType.UINT32: "<u4",
    GGUFValueType.INT32: "<i4",
    GGUFValueType.FLOAT32: "<f4",
    GGUFValueType.UINT64: "<u8",
    GGUFValueType.INT64: "<i8",
    GGUFValueType.FLOAT64: "<f8",
    GGUFValueType.BOOL: "<u1",
}
_ELEMENT_DTYPE = {  # GGUFReader's element dtype for unquantized tensors
    GGMLQuantizationType.F16: np.float16,
    GGMLQuantizationType.F32: np.float32,
    GGMLQuantizationType.F64: np.float64,
    GGMLQuantizationType.I8: np.int8,
    GGMLQuantizationType.I16: np.int16,
    GGMLQuantizationType.I32: np.int32,
    GGMLQuantizationType.I64: np.int64,
}


@dataclass
class GGUFField:
    """One metadata key: ``types`` as GGUFReader gives them ([ARRAY, item type] for arrays), the
    value decoded on first use, ``count`` the number of array items (1 for a scalar or string)."""

    name: str
    types: list[GGUFValueType]
    count: int
    _buf: memoryview = field(repr=False)
    _pos: int = field(repr=False)
    _value: Any = field(default=None, repr=False)
    _decoded: bool = field(default=False, repr=False)

    def value(self) -> Any:
        """str, int, float, bool, or a list of those for an array."""
        if not self._decoded:
            self._value = _decode(self._buf, self._pos, self.types)
            self._decoded = True
        return self._value


class GGUFFile:
    """``fields`` (key -> GGUFField) and ``tensors`` (``gguf.ReaderTensor``) of a little-endian GGUF v2/v3 file."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        buf = memoryview(self._map)  # struct and np.frombuffer read it without numpy views
        self.data = np.frombuffer(self._map, dtype=np.uint8)  # tensors are read-only views of it
        try:
            if bytes(buf[:4]) != b"GGUF":
                raise GGUFHeaderError(f"{self.path}: not a GGUF file (missing the 'GGUF' magic bytes)")
            (version,) = struct.unpack_from("<I", buf, 4)
            if version not in (2, 3):
                raise GGUFHeaderError(f"{self.path}: GGUF version {version} is not supported (2 or 3)")
            n_tensors, n_kv = struct.unpack_from("<QQ", buf, 8)
            pos = 24
            self.fields: dict[str, GGUFField] = {}
            for _ in range(n_kv):
                key, pos = _string(buf, pos)
                (raw,) = struct.unpack_from("<I", buf, pos)
                pos += 4
                types, count, end = _layout(buf, pos, GGUFValueType(raw))
                if key in self.fields:
                    raise GGUFHeaderError(f"{self.path}: duplicate metadata key {key!r}")
                self.fields[key] = GGUFField(key, types, count, buf, pos)
                pos = end
            infos = []
            for _ in range(n_tensors):
                name, pos = _string(buf, pos)
                (n_dims,) = struct.unpack_from("<I", buf, pos)
                dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
                raw_type, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
                pos += 4 + 8 * n_dims + 12
                infos.append((name, dims, raw_type, offset))
        except (struct.error, IndexError, UnicodeDecodeError) as exc:
            raise GGUFHeaderError(f"{self.path}: truncated or corrupt GGUF header ({exc})") from None
        alignment = (
            int(self.fields["general.alignment"].value()) if "general.alignment" in self.fields else 32
        )
        if alignment <= 0 or alignment & (alignment - 1):
            raise GGUFHeaderError(f"{self.path}: invalid alignment {alignment} (a power of two)")
        self.data_offset = pos + (-pos % alignment)
        self.tensors = [self._tensor(*info) for info in infos]
        if len({t.name for t in self.tensors}) != len(self.tensors):
            raise GGUFHeaderError(f"{self.path}: duplicated tensor names")

    def _tensor(self, name: str, dims: tuple[int, ...], raw_type: int, offset: int) -> ReaderTensor:
        kind = GGMLQuantizationType(raw_type)
        n_elems = int(np.prod(dims)) if dims else 1
        block, type_size = GGML_QUANT_SIZES[kind]
        n_bytes = n_elems * type_size // block
        start = self.data_offset + int(offset)
        shape: tuple[int, ...] = tuple(reversed(dims))
        dtype = _ELEMENT_DTYPE.get(kind)
        if dtype is None:
            dtype, shape = np.uint8, tuple(quant_shape_to_byte_shape(shape, kind))
        if start + n_bytes > len(self.data):
            raise GGUFHeaderError(f"{self.path}: tensor {name!r} runs past the end of the file")
        data = self.data[start : start + n_bytes].view(dtype).reshape(shape)
        info = ReaderField(0, name, [], [], [])
        return ReaderTensor(name, kind, np.array(dims, dtype=np.uint64), n_elems, n_bytes, start, data, info)


def _string(buf: memoryview, pos: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", buf, pos)
    end = pos + 8 + n
    if end > len(buf):
        raise IndexError("string runs past the end of the file")
    return bytes(buf[pos + 8 : end]).decode("utf-8"), end


def _layout(buf: memoryview, pos: int, kind: GGUFValueType) -> tuple[list[GGUFValueType], int, int]:
    """(types, item count, end position) of the value at ``pos``, skipping over it without decoding."""
    if kind == GGUFValueType.STRING:
        (n,) = struct.unpack_from("<Q", buf, pos)
        return [kind], 1, pos + 8 + n
    if kind in _SCALAR:
        return [kind], 1, pos + np.dtype(_SCALAR[kind]).itemsize
    if kind == GGUFValueType.ARRAY:
        raw, count = struct.unpack_from("<IQ", buf, pos)
        item = GGUFValueType(raw)
        pos += 12
        if item in _SCALAR:
            return [kind, item], count, pos + count * np.dtype(_SCALAR[item]).itemsize
        if item == GGUFValueType.STRING:
            for _ in range(count):
                (n,) = struct.unpack_from("<Q", buf, pos)
                pos += 8 + n
            return [kind, item], count, pos
        raise GGUFHeaderError("nested GGUF arrays are not supported")
    raise GGUFHeaderError(f"unknown GGUF value type {kind}")


def _decode(buf: memoryview, pos: int, types: list[GGUFValueType]) -> Any:
    kind = types[0]
    if kind == GGUFValueType.STRING:
        return _string(buf, pos)[0]
    if kind != GGUFValueType.ARRAY:
        value = np.frombuffer(buf, dtype=_SCALAR[kind], count=1, offset=pos).tolist()[0]
        return bool(value) if kind == GGUFValueType.BOOL else value
    item = types[1]
    (count,) = struct.unpack_from("<Q", buf, pos + 4)
    pos += 12
    if item == GGUFValueType.STRING:
        out = []
        for _ in range(count):
            text, pos = _string(buf, pos)
            out.append(text)
        return out
    values = np.frombuffer(buf, dtype=_SCALAR[item], count=count, offset=pos).tolist()
    return [bool(v) for v in values] if item == GGUFValueType.BOOL else values
