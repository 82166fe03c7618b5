"""Orchestration cost at many small shards: the batch_inference flow over N one-row shards, 4 lanes.

Measures what the flow costs beyond the engine: Prefect task runs created, Prefect API requests,
storage operations (run record, markers, staging, leases, throughput series: every call of the
pipeline's `Store`), peak RSS of the flow process, and orchestration milliseconds per shard
(flow wall time minus the time spent inside the engine, over the shard count). `--s3` puts input and
output on a moto S3 server on loopback (requests then are HTTP requests to it).

    python -m benchmarks.orchestration_scale --shards 10000 --lanes 4 [--s3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

STORE_OPS = (
    "exists",
    "read_bytes",
    "list_files",
    "write_atomic",
    "create_exclusive",
    "copy",
    "list_dir",
    "remove",
    "remove_tree",
    "listing",
    "remove_files",
)  # fmt: skip (the last two: issue 23's Store)
JOB: dict[str, Any] = {
    "id_column": "id",
    "prompt_column": "prompt",
    "sampling": {"max_tokens": 1, "temperature": 0.0},
    "engine": {"max_model_len": 128, "max_num_seqs": 16, "kv_cache_memory_bytes": 8 * 2**20},
}
ROWS_PER_FILE = 100


def write_input(root: str, shards: int, fs: Any = None) -> None:
    """`shards` rows in files of 100 rows, one row per row group (so shard_rows=1 gives one shard per row)."""
    for f in range(0, shards, ROWS_PER_FILE):
        n = min(ROWS_PER_FILE, shards - f)
        table = pa.table(
            {
                "id": [f"r{f + i:06d}" for i in range(n)],
                "prompt": [f"Item {f + i}: one word?" for i in range(n)],
            }
        )
        path = f"{root}/part-{f // ROWS_PER_FILE:05d}.parquet"
        if fs is None:
            pq.write_table(table, path, row_group_size=1)
        else:
            with fs.open(path, "wb") as out:
                pq.write_table(table, out, row_group_size=1)


class Counters:
    """Thread-safe call counts of the pipeline's storage operations, the engine time, API requests."""

    def __init__(self) -> None:
        self.ops: Counter[str] = Counter()
        self.api: Counter[str] = Counter()
        self.engine_s = 0.0
        self.lock = threading.Lock()


@contextmanager
def instrumented(counters: Counters) -> Iterator[None]:
    """Count every `Store` call, every Prefect API request, and time spent in the engine."""
    import httpx

    from prefixflow.pipeline.run import shard_execution
    from prefixflow.pipeline.storage.store import Store

    saved: dict[str, Any] = {}
    for name in STORE_OPS:
        if not hasattr(Store, name):  # an older checkout (the benchmark runs on both sides of a change)
            continue
        original = getattr(Store, name)
        saved[name] = original

        def counted(self: Any, *a: Any, _name: str = name, _orig: Any = original, **k: Any) -> Any:
            with counters.lock:
                counters.ops[_name] += 1
            out = _orig(self, *a, **k)
            if _name in ("list_files", "list_dir"):
                with counters.lock:
                    counters.ops["listed_entries"] += len(out)  # what a listing costs grows with this
            return out

        setattr(Store, name, counted)
    execute = shard_execution.execute

    def timed_execute(*a: Any, **k: Any) -> Iterator[Any]:
        start = time.perf_counter()
        try:
            yield from execute(*a, **k)
        finally:
            with counters.lock:
                counters.engine_s += time.perf_counter() - start

    shard_execution.execute = timed_execute  # type: ignore[assignment]
    send_async, send_sync = httpx.AsyncClient.send, httpx.Client.send

    async def asend(self: Any, request: Any, *a: Any, **k: Any) -> Any:
        with counters.lock:
            counters.api[f"{request.method} {_route(request.url.path)}"] += 1
        return await send_async(self, request, *a, **k)

    def ssend(self: Any, request: Any, *a: Any, **k: Any) -> Any:
        with counters.lock:
            counters.api[f"{request.method} {_route(request.url.path)}"] += 1
        return send_sync(self, request, *a, **k)

    httpx.AsyncClient.send, httpx.Client.send = asend, ssend  # type: ignore[method-assign]
    try:
        yield
    finally:
        for name, original in saved.items():
            setattr(Store, name, original)
        shard_execution.execute = execute  # type: ignore[assignment]
        httpx.AsyncClient.send, httpx.Client.send = send_async, send_sync  # type: ignore[method-assign]


def _route(path: str) -> str:
    """An API path with ids folded, e.g. /api/task_runs/{id}/set_state."""
    parts = [("{id}" if len(p) == 36 and p.count("-") == 4 else p) for p in path.split("/")]
    return "/".join(parts)[:80]


def count_task_runs(flow_run_id: Any) -> int:
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return len(runs)


def run_flow(
    inp: str, out: str, shards: int, lanes: int, storage: dict[str, Any] | None, poll_s: float = 2.0
) -> dict[str, Any]:
    from prefixflow.flows import batch_inference

    counters = Counters()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    cpu0 = time.process_time()
    start = time.perf_counter()
    with instrumented(counters):
        state = batch_inference(
            input=inp,
            output=out,
            model="tiny",
            job=JOB,
            shard_rows=1,
            lanes=lanes,
            concurrency_limit=None,
            progress_poll_s=poll_s,
            return_state=True,
            **(storage or {}),
        )
    wall = time.perf_counter() - start
    cpu = time.process_time() - cpu0
    result = state.result()
    api = sum(counters.api.values())
    ops = dict(sorted(counters.ops.items()))
    return {
        "shards": shards,
        "lanes": lanes,
        "complete": result["complete"],
        "wall_s": round(wall, 2),
        "process_cpu_s": round(cpu, 2),
        "engine_s": round(counters.engine_s, 2),
        "orchestration_ms_per_shard": round(1000 * (wall - counters.engine_s / lanes) / shards, 2),
        "orchestration_cpu_ms_per_shard": round(1000 * (cpu - counters.engine_s) / shards, 2),
        "task_runs": count_task_runs(state.state_details.flow_run_id),
        "api_requests": api,
        "api_requests_top": counters.api.most_common(8),
        "store_ops": ops,
        "store_ops_per_shard": round(sum(v for k, v in ops.items() if k != "listed_entries") / shards, 2),
        **_s3_figures(shards),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_growth_mib": round((resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) / 1024, 1),
        "loadavg": os.getloadavg(),
    }


S3_REQUESTS: Counter[str] = Counter()  # "METHOD folder" of every request moto's server answered (--s3)


def _s3_figures(shards: int) -> dict[str, Any]:
    if not S3_REQUESTS:
        return {}
    total = sum(S3_REQUESTS.values())
    return {
        "s3_requests": total,
        "s3_requests_per_shard": round(total / shards, 2),
        "s3_requests_top": S3_REQUESTS.most_common(12),
    }


def _count_s3_requests(app: Any) -> Any:
    """Wrap moto's WSGI app: count each request by method and the output folder it touches."""

    def counted(environ: dict[str, Any], start_response: Any) -> Any:
        from urllib.parse import parse_qs

        path = environ.get("PATH_INFO", "").split("/")  # /bucket/out-N/<folder>/...
        prefix = parse_qs(environ.get("QUERY_STRING", "")).get("prefix", [""])[0].split("/")
        where = path[3] if len(path) > 3 else f"list {prefix[1] or '(root)'}" if len(prefix) > 1 else "bucket"
        S3_REQUESTS[f"{environ.get('REQUEST_METHOD')} {where}"] += 1
        return app(environ, start_response)

    return counted


@contextmanager
def moto_s3() -> Iterator[tuple[str, Any]]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    assert server._server is not None
    server._server.app = _count_s3_requests(server._server.app)
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    import s3fs

    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
    fs.mkdir("bench")
    try:
        yield endpoint, fs
    finally:
        server.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, nargs="+", default=[10000])
    ap.add_argument("--lanes", type=int, default=4)
    ap.add_argument("--s3", action="store_true", help="input and output on a moto S3 server")
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    os.environ.setdefault("PREFIXFLOW_PROGRESS_INTERVAL", "3600")
    from prefect.testing.utilities import prefect_test_harness

    results = []
    with prefect_test_harness(server_startup_timeout=180), tempfile.TemporaryDirectory() as tmp:
        for n in args.shards:
            if args.s3:
                with moto_s3() as (endpoint, fs):
                    write_input(f"bench/in-{n}", n, fs)
                    S3_REQUESTS.clear()
                    r = run_flow(
                        f"s3://bench/in-{n}", f"s3://bench/out-{n}", n, args.lanes, {"endpoint_url": endpoint}
                    )
            else:
                Path(tmp, f"in-{n}").mkdir()
                write_input(f"{tmp}/in-{n}", n)
                r = run_flow(f"{tmp}/in-{n}", f"{tmp}/out-{n}", n, args.lanes, None)
            r["storage"] = "moto-s3" if args.s3 else "local"
            print(json.dumps(r), flush=True)
            results.append(r)
    meta = {"python": platform.python_version(), "cpus": os.cpu_count(), "results": results}
    if args.json:
        Path(args.json).write_text(json.dumps(meta, indent=1))


if __name__ == "__main__":
    main()
