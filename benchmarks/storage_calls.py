"""Storage calls and S3 requests, counted by kind and output folder: the instrumentation of the
round-trip regression test (tests/pipeline/run/test_round_trips.py) and of orchestration_scale.py.

``counted_calls`` wraps the pipeline's ``Store`` methods and the fsspec filesystem's own methods and
counts each call once at its outermost level; ``counted_requests`` counts every HTTP request botocore
sends (the S3 client's ``before-send`` event), so it sees exactly what S3 is asked.
"""

from __future__ import annotations

import re
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefixflow.pipeline.storage.store import Store

# Store methods and fsspec calls that reach the storage, by what kind of round trip they are
KINDS = {
    "read_bytes": "read",
    "exists": "exists",
    "list_files": "list",
    "list_dir": "list",
    "listing": "list",
    "write_atomic": "write",
    "create_exclusive": "create",
    "copy": "copy",
    "remove": "delete",
    "remove_files": "delete",
    "remove_tree": "delete",
    "read_range": "read",
    "open": "read",
    "cat_file": "read",
    "info": "exists",
    "find": "list",
    "ls": "list",
    "pipe_file": "write",
    "rm": "delete",
    "rm_file": "delete",
}
S3_KINDS = {
    "GetObject": "read",
    "HeadObject": "exists",
    "ListObjectsV2": "list",
    "PutObject": "write",
    "CopyObject": "copy",
    "DeleteObjects": "delete",
    "DeleteObject": "delete",
}


def _where(path: str, out_root: str) -> str:
    """The folder of the output a path is in (``_commits``, ``data`` ...), or ``input``."""
    path = str(path).split("://", 1)[-1]
    root = out_root.split("://", 1)[-1].rstrip("/")
    if not path.startswith(root + "/"):
        return "input" if path != root else "root"
    rest = path[len(root) + 1 :]
    return rest.split("/", 1)[0] if "/" in rest else rest


@contextmanager
def counted_calls(out_root: str, store: Store) -> Iterator[Counter[tuple[str, str]]]:
    """Every storage call, counted once at its outermost level: the pipeline's Store methods (the local
    primitives go to the OS directly) and the fsspec filesystem's own methods (pyarrow reads through them)."""
    calls: Counter[tuple[str, str]] = Counter()
    depth = threading.local()
    undo: list[tuple[Any, str, Any]] = []

    def wrap(owner: Any, name: str) -> None:
        if not hasattr(owner, name):  # an older checkout (benchmarks run on both sides of a change)
            return
        original = getattr(owner, name)

        def counted(*a: Any, **k: Any) -> Any:
            args = a[1:] if owner is Store else a
            level = getattr(depth, "n", 0)
            if level == 0 and args:
                first = (
                    args[0][0] if isinstance(args[0], list) and args[0] else args[-1 if name == "copy" else 0]
                )
                calls[(KINDS[name], _where(str(first), out_root))] += 1
            depth.n = level + 1
            try:
                return original(*a, **k)
            finally:
                depth.n = level

        undo.append((owner, name, original))
        setattr(owner, name, counted)

    for name in (
        "read_bytes",
        "exists",
        "list_files",
        "list_dir",
        "listing",
        "write_atomic",
        "create_exclusive",
        "copy",
        "remove",
        "remove_files",
        "remove_tree",
        "read_range",
    ):
        wrap(Store, name)
    for name in ("open", "cat_file", "info", "find", "ls", "pipe_file", "rm", "rm_file"):
        wrap(store.fs, name)
    try:
        yield calls
    finally:
        for owner, name, original in reversed(undo):
            if owner is Store:
                setattr(owner, name, original)
            else:
                delattr(owner, name)


@contextmanager
def counted_requests(out_root: str, store: Store) -> Iterator[Counter[tuple[str, str]]]:
    """Every HTTP request the S3 client sends (botocore's ``before-send``), by operation and folder."""
    calls: Counter[tuple[str, str]] = Counter()

    def on_send(request: Any, event_name: str, **_: Any) -> None:
        op = event_name.rsplit(".", 1)[-1]
        key = request.url.split("://", 1)[-1].split("/", 1)[-1].split("?", 1)[0]
        if op == "DeleteObjects":  # a batch: the folder of its first key
            key = re.search(rb"<Key>([^<]+)</Key>", request.body).group(1).decode()
            key = out_root.split("://", 1)[-1].split("/", 1)[0] + "/" + key
        kind = (
            "create" if op == "PutObject" and request.headers.get("If-None-Match") else S3_KINDS.get(op, op)
        )
        calls[(kind, _where(key, out_root))] += 1

    store.fs.connect()
    store.fs.s3.meta.events.register("before-send.s3", on_send)
    try:
        yield calls
    finally:
        store.fs.s3.meta.events.unregister("before-send.s3", on_send)
