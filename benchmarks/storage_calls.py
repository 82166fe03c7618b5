"""Storage calls and S3 requests, counted by kind and output folder: the instrumentation of the
round-trip regression test (tests/pipeline/run/test_round_trips.py) and of orchestration_scale.py.

``counted_calls`` wraps the pipeline's ``Store`` methods and the fsspec filesystem's own methods and
counts each call once at its outermost level; ``counted_requests`` counts every HTTP request botocore
sends (the S3 client's ``before-send`` event), so it sees exactly what S3 is asked.

Run as a script it measures what one more shard costs the output: a whole `prefixflow run` (plan,
prepare, the shard loop, finalize) of N and of 2N one-row shards, ``--model tiny``, ``max_tokens`` 1,
locally (every call) and on moto's S3 server (every request); per extra shard = (calls(2N) - calls(N)) / N.
``--parts P`` makes each shard P rows flushed one row at a time, so a shard is P parts.
The input side is left out (the advisor samples rows shard by shard at plan time). ``--publish`` sets
``output.publish`` (leave it out on a checkout that predates the option):

    python -m benchmarks.storage_calls --shards 100 --publish direct copy
    python -m benchmarks.storage_calls --shards 50 --parts 4 --publish direct copy
"""

from __future__ import annotations

import argparse
import json
import re
import tempfile
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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


# -- the script: one more shard's cost on the output ----------------------------------------------------
def _write_input(folder: Path, rows: int, parts: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir(parents=True, exist_ok=True)
    for f in range(2):  # two files of row groups of `parts` rows: one shard per row group
        table = pa.table(
            {"id": [f"r{f}-{i}" for i in range(rows // 2)], "text": [f"item {i}" for i in range(rows // 2)]}
        )
        pq.write_table(table, folder / f"part-{f}.parquet", row_group_size=parts)


def _run_calls(
    root: Path, shards: int, parts: int, llm: Any, publish: str | None, endpoint: str | None
) -> Counter[tuple[str, str]]:
    from prefixflow.pipeline import load_job
    from prefixflow.pipeline.local_run import run_local

    flush = {"flush_rows": 4} if parts == 1 else {"flush_rows": 1}
    output: dict[str, Any] = {"shard_rows": parts, **flush, **({"publish": publish} if publish else {})}
    job = {
        "task": "generate",
        "id_column": "id",
        "template": "Say {{ text }}",
        "engine": {"max_model_len": 160, "max_num_seqs": 32},
        "sampling": {"max_tokens": 1},
        "output": output,
    }
    _write_input(root / "in", shards * parts, parts)
    if endpoint is None:
        inp, out, extra = str(root / "in"), str(root / "out"), {}
    else:
        import s3fs

        bucket = f"calls-{uuid.uuid4().hex[:8]}"
        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
        fs.mkdir(bucket)
        fs.put(str(root / "in") + "/", f"{bucket}/in/", recursive=True)
        inp, out, extra = f"s3://{bucket}/in", f"s3://{bucket}/out", {"endpoint_url": endpoint}
    spec = load_job(inp, out, "tiny", job, **extra)
    count = counted_calls if endpoint is None else counted_requests
    with count(out, Store.open(out, spec.config.storage)) as calls:
        summary, failures = run_local(spec, llm=llm, progress=False)
    assert not failures and summary.complete and summary.rows == shards * parts, (failures, summary)
    calls.pop(("write", "_leases"), None)  # renewals depend on time, not shards
    return calls


def measure(
    shards: int, publish: str | None, endpoint: str | None, llm: Any, parts: int = 1
) -> dict[str, Any]:
    """Output calls per extra shard between runs of ``shards`` and ``2 * shards`` shards, by kind."""
    with tempfile.TemporaryDirectory() as tmp:
        small = _run_calls(Path(tmp, "small"), shards, parts, llm, publish, endpoint)
        large = _run_calls(Path(tmp, "large"), 2 * shards, parts, llm, publish, endpoint)
    keys = {k for k in set(small) | set(large) if k[1] != "input"}
    extra = {
        f"{k} {w}": (large[(k, w)] - small[(k, w)]) / shards
        for k, w in sorted(keys)
        if large[(k, w)] != small[(k, w)]
    }
    return {
        "storage": "local" if endpoint is None else "moto-s3",
        "publish": publish or "(checkout default)",
        "shards": [shards, 2 * shards],
        "parts_per_shard": parts,
        "output_calls": [
            sum(v for k, v in small.items() if k[1] != "input"),
            sum(v for k, v in large.items() if k[1] != "input"),
        ],
        "per_extra_shard": round(sum(extra.values()), 3),
        "per_extra_shard_by_kind": {k: round(v, 3) for k, v in extra.items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, default=100, help="N: runs of N and 2N one-row shards")
    ap.add_argument(
        "--publish", nargs="*", default=[], help="output.publish values to measure (default: none set)"
    )
    ap.add_argument("--parts", type=int, default=1, help="rows (= flushed parts) per shard")
    ap.add_argument("--storage", nargs="+", choices=("local", "s3"), default=["local", "s3"])
    ap.add_argument("--json", help="append the results here (one JSON object a line)")
    args = ap.parse_args()
    from prefixflow.engine import LLM

    llm = LLM(model="tiny", max_model_len=160, max_num_seqs=32)
    server = None
    endpoint = None
    if "s3" in args.storage:
        import logging
        import os

        from moto.server import ThreadedMotoServer

        logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise

        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            os.environ.setdefault(name, "testing")
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
        server.start()
        host, port = server.get_host_and_port()
        endpoint = f"http://{host}:{port}"
    try:
        for storage in args.storage:
            for publish in args.publish or [None]:
                result = measure(args.shards, publish, endpoint if storage == "s3" else None, llm, args.parts)
                print(json.dumps(result))
                if args.json:
                    with open(args.json, "a") as f:
                        f.write(json.dumps(result) + "\n")
    finally:
        if server is not None:
            server.stop()


if __name__ == "__main__":
    main()
