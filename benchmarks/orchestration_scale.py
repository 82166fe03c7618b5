"""Orchestration cost at many small shards: the batch_inference flow over N one-row shards, 4 lanes.

The input is ONE Parquet file of N rows and the job has ``shard_rows`` 1, so there are N shards however
planning packs files. Each (shard count, engine) pair runs in a fresh child process (clean peak RSS and
CPU) against Prefect's ``prefect_test_harness`` (a temporary SQLite server in its own process). Counted
in the flow process: Prefect task runs, HTTP requests to the Prefect API by route, log records and
artifacts the run left in the API, storage calls by kind and output folder (benchmarks/storage_calls.py:
the pipeline's Store and the fsspec filesystem, outermost call only), peak RSS, process CPU, and the
engine's share: the thread CPU and wall time inside ``execute`` (engine steps) and the lanes' engine
loads. ``--engine null`` keeps everything but the model's steps (each request finishes at once with one
token): its wall time per shard is the orchestration alone. ``--s3``: input and output on moto's S3
server in its own process (its requests counted there by method and folder).

    python -m benchmarks.orchestration_scale --shards 1000 3000 10000 --engine null real [--s3]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
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

JOB: dict[str, Any] = {
    "id_column": "id",
    "prompt_column": "prompt",
    "sampling": {"max_tokens": 1, "temperature": 0.0},
    "engine": {"max_model_len": 128, "max_num_seqs": 16, "kv_cache_memory_bytes": 8 * 2**20},
}


def write_input(root: str, rows: int, fs: Any = None, row_group_rows: int = 0) -> None:
    """One file of ``rows`` rows (row groups of ``row_group_rows``, 0: one group), so shard_rows=1 gives
    one shard per row."""
    table = pa.table(
        {"id": [f"r{i:06d}" for i in range(rows)], "prompt": [f"Item {i}: one word?" for i in range(rows)]}
    )
    path = f"{root}/data.parquet"
    group = row_group_rows or max(rows, 1)
    if fs is None:
        pq.write_table(table, path, row_group_size=group)
    else:
        with fs.open(path, "wb") as out:
            pq.write_table(table, out, row_group_size=group)


class Counters:
    """Thread-safe counts: API requests by route, engine thread CPU / wall, engine loads."""

    def __init__(self) -> None:
        self.api: Counter[str] = Counter()
        self.engine_cpu_s = self.engine_wall_s = self.load_cpu_s = 0.0
        self.lock = threading.Lock()


def _null_stream(self: Any, prompts: Any, params: Any = None, request_ids: Any = None) -> Iterator[Any]:
    """`LLM.generate_stream` without the model: every request finishes at once with one token."""
    from prefixflow.engine import RequestOutput

    for i, (prompt, rid) in enumerate(zip(prompts, request_ids or [])):
        yield RequestOutput(
            request_id=rid,
            index=i,
            text=" x",
            token_ids=(1,),
            finish_reason="length",
            num_prompt_tokens=len(prompt),
            num_output_tokens=1,
        )


@contextmanager
def instrumented(counters: Counters, null_engine: bool = False) -> Iterator[None]:
    """Count Prefect API requests, time the engine's steps and loads; optionally skip the model's steps."""
    import httpx

    from prefixflow.engine.llm import LLM
    from prefixflow.flows import lanes
    from prefixflow.pipeline.run import shard_execution

    execute, load = shard_execution.execute, lanes.open_engine
    stream = LLM.generate_stream

    def timed_execute(*a: Any, **k: Any) -> Iterator[Any]:
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            yield from execute(*a, **k)
        finally:
            with counters.lock:
                counters.engine_cpu_s += time.thread_time() - cpu
                counters.engine_wall_s += time.perf_counter() - wall

    def timed_load(*a: Any, **k: Any) -> Any:
        cpu = time.thread_time()
        try:
            return load(*a, **k)
        finally:
            with counters.lock:
                counters.load_cpu_s += time.thread_time() - cpu

    send_async, send_sync = httpx.AsyncClient.send, httpx.Client.send

    async def asend(self: Any, request: Any, *a: Any, **k: Any) -> Any:
        with counters.lock:
            counters.api[f"{request.method} {_route(request.url.path)}"] += 1
        return await send_async(self, request, *a, **k)

    def ssend(self: Any, request: Any, *a: Any, **k: Any) -> Any:
        with counters.lock:
            counters.api[f"{request.method} {_route(request.url.path)}"] += 1
        return send_sync(self, request, *a, **k)

    shard_execution.execute = timed_execute  # type: ignore[assignment]
    lanes.open_engine = timed_load  # type: ignore[assignment]
    httpx.AsyncClient.send, httpx.Client.send = asend, ssend  # type: ignore[method-assign]
    if null_engine:
        LLM.generate_stream = _null_stream  # type: ignore[assignment]
    try:
        yield
    finally:
        shard_execution.execute = execute  # type: ignore[assignment]
        lanes.open_engine = load  # type: ignore[assignment]
        httpx.AsyncClient.send, httpx.Client.send = send_async, send_sync  # type: ignore[method-assign]
        LLM.generate_stream = stream  # type: ignore[method-assign]


def _route(path: str) -> str:
    """An API path with ids folded, e.g. /api/task_runs/{id}/set_state."""
    parts = [("{id}" if len(p) == 36 and p.count("-") == 4 else p) for p in path.split("/")]
    return "/".join(parts)[:80]


def api_records(flow_run_id: Any) -> dict[str, int]:
    """What the run left in the Prefect API: task runs, log records, artifacts."""
    from prefect import get_client
    from prefect.client.schemas.filters import (
        ArtifactFilter,
        ArtifactFilterFlowRunId,
        FlowRunFilter,
        FlowRunFilterId,
        LogFilter,
        LogFilterFlowRunId,
    )

    with get_client(sync_client=True) as client:
        tasks = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
        logs, offset = 0, 0
        while True:
            page = client.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])), limit=200, offset=offset
            )
            logs += len(page)
            offset += len(page)
            if len(page) < 200:
                break
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {"task_runs": len(tasks), "log_records": logs, "artifacts": len(artifacts)}


def run_flow(
    inp: str,
    out: str,
    shards: int,
    lanes: int,
    storage: dict[str, Any] | None,
    poll_s: float = 2.0,
    null_engine: bool = False,
) -> dict[str, Any]:
    """One flow run with everything counted (the caller runs it inside a Prefect server or harness)."""
    from benchmarks.storage_calls import counted_calls
    from prefixflow.flows import batch_inference
    from prefixflow.pipeline.job.config import StorageConfig
    from prefixflow.pipeline.storage.store import Store

    counters = Counters()
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    store = Store.open(out, StorageConfig(**(storage or {})))
    cpu0, start = time.process_time(), time.perf_counter()
    with instrumented(counters, null_engine), counted_calls(out, store) as calls:
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
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
    result = state.result()
    engine = counters.engine_cpu_s + counters.load_cpu_s
    by_kind: Counter[str] = Counter()
    for (kind, _), n in calls.items():
        by_kind[kind] += n
    return {
        "shards": shards,
        "lanes": lanes,
        "engine": "null" if null_engine else "tiny",
        "complete": result["complete"],
        "wall_s": round(wall, 2),
        "process_cpu_s": round(cpu, 2),
        "engine_step_cpu_s": round(counters.engine_cpu_s, 2),
        "engine_step_wall_s": round(counters.engine_wall_s, 2),
        "engine_load_cpu_s": round(counters.load_cpu_s, 2),
        "orchestration_cpu_ms_per_shard": round(1000 * (cpu - engine) / shards, 2),
        "wall_ms_per_shard": round(1000 * wall / shards, 2),
        **api_records(state.state_details.flow_run_id),
        "api_requests": sum(counters.api.values()),
        "api_requests_top": counters.api.most_common(6),
        "storage_calls": sum(calls.values()),
        "storage_calls_per_shard": round(sum(calls.values()) / shards, 2),
        "storage_calls_by_kind": dict(sorted(by_kind.items())),
        "storage_calls_top": [[f"{k} {w}", n] for (k, w), n in calls.most_common(10)],
        "storage_calls_all": {f"{k} {w}": n for (k, w), n in sorted(calls.items())},
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_before_flow_mib": round(rss0 / 1024, 1),
        "loadavg": [round(x, 1) for x in os.getloadavg()],
    }


# -- moto's S3 server in its own process, counting what it is asked -------------------------------------
MOTO_CHILD = r"""
import json, sys
from collections import Counter
from urllib.parse import parse_qs
from moto.server import ThreadedMotoServer
counts = Counter()
server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
server.start()
app = server._server.app
def counted(environ, start_response):
    path = environ.get("PATH_INFO", "")
    if path == "/__counts__":
        start_response("200 OK", [("Content-Type", "application/json")])
        return [json.dumps(counts.most_common()).encode()]
    parts = path.split("/")  # /bucket/out/<folder>/...
    query = parse_qs(environ.get("QUERY_STRING", ""))
    prefix = query.get("prefix", [""])[0].split("/")
    method = environ.get("REQUEST_METHOD")
    if method == "GET" and "prefix" in query or method == "GET" and len(parts) <= 2:
        where = "LIST " + (prefix[1] if len(prefix) > 1 else prefix[0] or "(root)")
    else:
        where = method + " " + (parts[3] if len(parts) > 3 else parts[2] if len(parts) > 2 else "bucket")
    counts[where] += 1
    return app(environ, start_response)
server._server.app = counted
print("%s:%s" % server.get_host_and_port(), flush=True)
sys.stdin.read()
server.stop()
"""


@contextmanager
def moto_s3() -> Iterator[tuple[str, Any]]:
    """An S3 endpoint on loopback (moto's server, its own process) and an s3fs filesystem on it."""
    proc = subprocess.Popen(
        [sys.executable, "-c", MOTO_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        endpoint = f"http://{proc.stdout.readline().strip()}"
        for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing")):
            os.environ.setdefault(key, value)
        os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
        import s3fs

        fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": endpoint})
        fs.mkdir("bench")
        yield endpoint, fs
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=30)


def s3_counts(endpoint: str) -> Counter[str]:
    import urllib.request

    with urllib.request.urlopen(f"{endpoint}/__counts__") as reply:
        return Counter(dict(json.loads(reply.read())))


# -- one measurement (child process) and the sweep (parent) --------------------------------------------
def measure(shards: int, lanes: int, null_engine: bool, s3: bool, row_group_rows: int) -> dict[str, Any]:
    import torch
    from prefect.testing.utilities import prefect_test_harness

    torch.set_num_threads(1)  # the engine's CPU then runs on the lane's own thread, where it is timed
    os.environ.setdefault("PREFIXFLOW_PROGRESS_INTERVAL", "3600")
    with prefect_test_harness(server_startup_timeout=180), tempfile.TemporaryDirectory() as tmp:
        if s3:
            with moto_s3() as (endpoint, fs):
                write_input("bench/in", shards, fs, row_group_rows)
                before = s3_counts(endpoint)
                r = run_flow(
                    "s3://bench/in",
                    "s3://bench/out",
                    shards,
                    lanes,
                    {"endpoint_url": endpoint},
                    null_engine=null_engine,
                )
                asked = s3_counts(endpoint) - before
                asked.pop("GET __counts__", None)
                r.update(
                    s3_requests=sum(asked.values()),
                    s3_requests_per_shard=round(sum(asked.values()) / shards, 2),
                    s3_lists=sum(n for k, n in asked.items() if k.startswith("LIST")),
                    s3_requests_top=asked.most_common(10),
                )
        else:
            Path(tmp, "in").mkdir()
            write_input(f"{tmp}/in", shards, row_group_rows=row_group_rows)
            r = run_flow(f"{tmp}/in", f"{tmp}/out", shards, lanes, None, null_engine=null_engine)
    r["storage"] = "moto-s3" if s3 else "local"
    r["row_group_rows"] = row_group_rows or shards
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shards", type=int, nargs="+", default=[1000, 3000, 10000])
    ap.add_argument("--engine", nargs="+", choices=("null", "real"), default=["null", "real"])
    ap.add_argument("--lanes", type=int, default=4)
    ap.add_argument("--s3", action="store_true", help="input and output on a moto S3 server")
    ap.add_argument("--row-group-rows", type=int, default=0, help="rows per input row group (0: one group)")
    ap.add_argument("--repeat", type=int, default=1, help="run the whole sweep this many times, interleaved")
    ap.add_argument("--json", help="append the results here (one JSON object a line)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        r = measure(args.shards[0], args.lanes, args.engine[0] == "null", args.s3, args.row_group_rows)
        print("RESULT " + json.dumps(r), flush=True)
        return
    for _ in range(args.repeat):
        for n in args.shards:
            for engine in args.engine:  # interleaved: null, real, null, real ...
                cmd = [sys.executable, "-m", "benchmarks.orchestration_scale", "--child", "--shards", str(n)]
                cmd += [
                    "--engine",
                    engine,
                    "--lanes",
                    str(args.lanes),
                    "--row-group-rows",
                    str(args.row_group_rows),
                ]
                cmd += ["--s3"] if args.s3 else []
                done = subprocess.run(cmd, capture_output=True, text=True)
                lines = [x for x in done.stdout.splitlines() if x.startswith("RESULT ")]
                if not lines:
                    print(f"{n} {engine}: failed (rc {done.returncode})\n{done.stderr[-3000:]}", flush=True)
                    continue
                r = json.loads(lines[-1].removeprefix("RESULT "))
                r.update(python=platform.python_version(), cpus=os.cpu_count())
                print(json.dumps(r), flush=True)
                if args.json:
                    with open(args.json, "a") as out:
                        out.write(json.dumps(r) + "\n")


if __name__ == "__main__":
    main()
