"""engine/gguf/reader.py reads exactly what gguf.GGUFReader reads (issue 24: the load's biggest cost).

Compared on a file written here with every metadata value type (scalars, strings, arrays of numbers,
of strings, of bools) and tensors of several block types, and on the embedded SmolLM2 GGUF.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf import GGUFReader, GGUFValueType
from gguf.quants import quantize

from prefixflow.engine.gguf.header import GGUFHeaderError
from prefixflow.engine.gguf.reader import GGUFFile
from prefixflow.engine.loading.embedded import resolve_embedded


def reference_value(field: Any) -> Any:
    """A GGUFReader field as a plain value: the decoding the loader used before GGUFFile."""

    def decode(part: np.ndarray, kind: GGUFValueType) -> Any:
        if kind == GGUFValueType.STRING:
            return bytes(part).decode("utf-8")
        value = part.tolist()[0]
        return bool(value) if kind == GGUFValueType.BOOL else value

    if field.types[0] == GGUFValueType.ARRAY:
        return [decode(field.parts[i], field.types[-1]) for i in field.data]
    return decode(field.parts[field.data[0]], field.types[0])


def assert_same(path: Path) -> None:
    ref, fast = GGUFReader(path), GGUFFile(path)
    ref_fields = {k: f for k, f in ref.fields.items() if not k.startswith("GGUF.")}  # its header pseudo-keys
    assert list(fast.fields) == list(ref_fields)
    for key, field in ref_fields.items():
        mine = fast.fields[key]
        assert mine.types == field.types, key
        assert mine.value() == reference_value(field), key
        assert mine.count == (len(field.data) if field.types[0] == GGUFValueType.ARRAY else 1), key
    assert fast.data_offset == ref.data_offset
    assert len(fast.tensors) == len(ref.tensors)
    for a, b in zip(fast.tensors, ref.tensors):
        assert (a.name, a.tensor_type, a.n_elements, a.n_bytes, a.data_offset) == (
            b.name,
            b.tensor_type,
            b.n_elements,
            b.n_bytes,
            b.data_offset,
        )
        assert a.shape.tolist() == b.shape.tolist()
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name


def test_every_value_type_and_block_type_reads_like_gguf_reader(tmp_path: Path) -> None:
    path = tmp_path / "all.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_uint8("t.u8", 7)
    w.add_int8("t.i8", -7)
    w.add_uint16("t.u16", 65535)
    w.add_int16("t.i16", -300)
    w.add_uint32("t.u32", 4_000_000_000)
    w.add_int32("t.i32", -5)
    w.add_float32("t.f32", 1e-5)
    w.add_uint64("t.u64", 2**40)
    w.add_int64("t.i64", -(2**40))
    w.add_float64("t.f64", 0.1)
    w.add_bool("t.bool", True)
    w.add_string("t.str", "héllo <|im_end|>")
    w.add_array("t.strs", ["a", "", "Ġthe", "ü" * 40])
    w.add_array("t.ints", [1, -2, 3])
    w.add_array("t.floats", [0.5, -1.25])
    w.add_array("t.bools", [True, False])
    rng = np.random.default_rng(0)
    w.add_tensor("f32", rng.standard_normal((3, 64)).astype(np.float32))
    w.add_tensor("f16", rng.standard_normal((2, 32)).astype(np.float16))
    w.add_tensor("vec", rng.standard_normal(5).astype(np.float32))
    for kind in (Q.Q8_0, Q.Q4_0, Q.Q4_1):
        x = rng.standard_normal((4, 64)).astype(np.float32)
        w.add_tensor(f"q.{kind.name}", quantize(x, kind), raw_dtype=kind)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    assert_same(path)


@pytest.mark.slow  # ~10 s: GGUFReader itself is the slow part
def test_the_embedded_smollm2_file_reads_like_gguf_reader() -> None:
    path = resolve_embedded("smollm2-135m-instruct")
    assert path is not None
    assert_same(path)


def test_a_truncated_header_is_a_clear_error(tmp_path: Path) -> None:
    path = resolve_embedded("smollm2-135m-instruct")
    assert path is not None
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(path.read_bytes()[:100_000])  # inside the vocabulary
    with pytest.raises(GGUFHeaderError, match="truncated or corrupt GGUF header"):
        GGUFFile(cut)
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + bytes(64))
    with pytest.raises(GGUFHeaderError, match="not a GGUF file"):
        GGUFFile(bad)
