"""Arrow types from a JSON schema, so extracted JSON lands in typed columns (struct, list, int64, ...)
that polars, pyarrow and DuckDB read as data rather than as text.

Mapping: object with properties -> struct (declared order, every field nullable); array with ``items``
-> list; string -> string; integer -> int64; number -> float64; boolean -> bool; ``enum``/``const``
-> the values' common type; ``["T", "null"]`` -> T. What has no single Arrow type (free-form objects,
tuples, mixed unions, recursion, ``null``) is kept as its JSON text in a string field, so nothing is lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

MAX_DEPTH = 32

SCALARS: dict[str, tuple[str, pa.DataType]] = {
    "string": ("str", pa.string()),
    "integer": ("int", pa.int64()),
    "number": ("float", pa.float64()),
    "boolean": ("bool", pa.bool_()),
}


@dataclass(frozen=True)
class Shape:
    """How one schema node is stored: its Arrow type and how a parsed JSON value is converted to it."""

    kind: str  # struct | list | str | int | float | bool | json
    type: pa.DataType
    fields: tuple[tuple[str, Shape], ...] = ()
    item: Shape | None = field(default=None)


JSON_TEXT = Shape("json", pa.string())


def shape_of(schema: Any, root: Any = None, refs: tuple[str, ...] = ("#",), depth: int = 0) -> Shape:
    """The storage shape of ``schema`` (``root`` resolves local ``$ref`` pointers such as ``#/$defs/x``;
    ``refs`` are the references being expanded, so a recursive one becomes JSON text)."""
    root = schema if root is None else root
    if not isinstance(schema, dict) or depth > MAX_DEPTH:
        return JSON_TEXT
    ref = schema.get("$ref")
    if isinstance(ref, str):
        target = _resolve(root, ref)
        if target is None or ref in refs:  # unresolvable or recursive: keep the JSON text
            return JSON_TEXT
        return shape_of(target, root, (*refs, ref), depth + 1)
    if "const" in schema:
        return _of_values([schema["const"]])
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return _of_values(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            options = [shape_of(s, root, refs, depth + 1) for s in schema[key] if not _is_null(s)]
            return _common(options)
    if isinstance(schema.get("allOf"), list) and len(schema["allOf"]) == 1:
        return shape_of(schema["allOf"][0], root, refs, depth + 1)
    kinds = schema.get("type")
    if isinstance(kinds, list):
        kinds = [k for k in kinds if k != "null"]
        kinds = kinds[0] if len(kinds) == 1 else None
    if kinds is None and "properties" in schema:
        kinds = "object"
    if kinds is None and "items" in schema:
        kinds = "array"
    if kinds in SCALARS:
        kind, typ = SCALARS[kinds]
        return Shape(kind, typ)
    if kinds == "object":
        props = schema.get("properties")
        if not isinstance(props, dict) or not props:
            return JSON_TEXT  # free-form object: no fixed fields
        fields = tuple((str(name), shape_of(sub, root, refs, depth + 1)) for name, sub in props.items())
        return Shape("struct", pa.struct([pa.field(n, s.type) for n, s in fields]), fields=fields)
    if kinds == "array":
        items = schema.get("items")
        if not isinstance(items, dict) or "prefixItems" in schema:
            return JSON_TEXT  # tuples and untyped arrays
        item = shape_of(items, root, refs, depth + 1)
        return Shape("list", pa.list_(item.type), item=item)
    return JSON_TEXT


def to_arrow(value: Any, shape: Shape) -> Any:
    """``value`` (parsed JSON) as the Python object pyarrow stores under ``shape.type``."""
    if value is None:
        return None
    kind = shape.kind
    if kind == "json":
        return json.dumps(value, ensure_ascii=False)
    if kind == "struct":
        if not isinstance(value, dict):
            raise ValueError(f"expected an object, got {type(value).__name__}")
        return {name: to_arrow(value.get(name), sub) for name, sub in shape.fields}
    if kind == "list":
        if not isinstance(value, list):
            raise ValueError(f"expected an array, got {type(value).__name__}")
        assert shape.item is not None
        return [to_arrow(v, shape.item) for v in value]
    if kind == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)  # JSON 3.0 is an integer to a JSON schema validator
        if not isinstance(value, int) or isinstance(value, bool):
            raise ValueError(f"expected an integer, got {value!r}")
        if not -(2**63) <= value < 2**63:
            raise ValueError(f"integer {value} does not fit in int64")
        return value
    if kind == "float":
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ValueError(f"expected a number, got {value!r}")
        return float(value)
    if kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
        return value
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def _of_values(values: list[Any]) -> Shape:
    non_null = [v for v in values if v is not None]
    if non_null and all(isinstance(v, str) for v in non_null):
        return Shape("str", pa.string())
    if non_null and all(isinstance(v, bool) for v in non_null):
        return Shape("bool", pa.bool_())
    if non_null and all(isinstance(v, int) and not isinstance(v, bool) for v in non_null):
        return Shape("int", pa.int64())
    if non_null and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in non_null):
        return Shape("float", pa.float64())
    return JSON_TEXT


def _common(options: list[Shape]) -> Shape:
    if options and all(o == options[0] for o in options):
        return options[0]
    if options and {o.kind for o in options} == {"int", "float"}:
        return Shape("float", pa.float64())
    return JSON_TEXT


def _is_null(schema: Any) -> bool:
    return isinstance(schema, dict) and schema.get("type") == "null"


def _resolve(root: Any, ref: str) -> Any:
    if not ref.startswith("#"):
        return None  # remote references are not fetched
    node = root
    for part in ref[1:].split("/")[1:]:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return None
    return node
