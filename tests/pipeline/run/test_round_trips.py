"""Issue 23 item 1: the storage round trips of a shard, counted through an instrumented filesystem, on a
local folder and on S3 (moto's server, every HTTP request counted by botocore's own event hooks).

A shard costs exactly, with ``output.publish: direct`` (the default) and the shard written as one part:
one read of its input, one exclusive create of its part at its data/ name, one exclusive create of its
marker. With ``publish: copy``: one read, one write of its staged part, one exclusive create of its
marker, one copy of the part into data/ (publishing is part of committing, issue 22). Nothing else per
shard: no read of the run record, no existence check, no listing. A run adds a constant on top (prepare,
one listing, finalize), and deleting committed shards' staged parts is batched (one request per run here).
"""

from __future__ import annotations

import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import s3fs

from benchmarks.storage_calls import counted_calls, counted_requests
from prefixflow.pipeline import load_job, plan_shards, prepare_run, run_shards
from prefixflow.pipeline.local_run import run_local
from prefixflow.pipeline.run.record import hold_output
from prefixflow.pipeline.storage.store import Store
from tests.pipeline.support import ENGINE, write_parquet

SHARDS = 8  # two files of four one-row row groups, one shard per row
PER_SHARD = {
    "direct": {("read", "input"): 1, ("create", "data"): 1, ("create", "_commits"): 1},
    "copy": {("read", "input"): 1, ("write", "_staging"): 1, ("create", "_commits"): 1, ("copy", "data"): 1},
}
# once per shard loop: the id index, the lane's throughput series, and (copy) the committed shards' staged
# parts deleted in one batch
ONCE = {
    "direct": {("read", "_ids"): 1, ("write", "_metrics"): 1},
    "copy": {("read", "_ids"): 1, ("delete", "_staging"): 1, ("write", "_metrics"): 1},
}
MODES = ("direct", "copy")


def _write_input(folder: Path, shards: int = SHARDS) -> None:
    for f in range(2):
        rows = [{"id": f"r{f}-{i}", "text": f"item {f} {i}"} for i in range(shards // 2)]
        write_parquet(folder / f"part-{f}.parquet", rows, row_group_size=1)


JOB = {
    "task": "generate",
    "id_column": "id",
    "template": "Say {{ text }}",
    "engine": dict(ENGINE),
    "sampling": {"max_tokens": 1},
    "output": {"shard_rows": 1, "flush_rows": 4},
}


def _job(publish: str) -> dict[str, Any]:
    return {**JOB, "output": {**JOB["output"], "publish": publish}}


def _shard_loop_calls(
    inp: str, out: str, llm: Any, storage: dict[str, Any], count: Any, publish: str
) -> Counter[tuple[str, str]]:
    spec = load_job(inp, out, "tiny", _job(publish), **storage)
    shards = plan_shards(spec)
    assert len(shards) == SHARDS
    store = Store.open(out, spec.config.storage)
    with hold_output(spec):
        run = prepare_run(spec, shards=shards)
        with count(out, store) as calls:
            outcomes = list(run_shards(run, shards, llm))
    assert all(o.error is None for o in outcomes)
    calls.pop(("write", "_leases"), None)  # renewals are per process and time (every TTL/4), not per shard
    return calls


def _check(calls: Counter[tuple[str, str]], publish: str) -> None:
    per_shard = {k: v for k, v in calls.items() if v >= SHARDS}
    assert per_shard == {k: v * SHARDS for k, v in PER_SHARD[publish].items()}, calls
    assert {k: v for k, v in calls.items() if v < SHARDS} == ONCE[publish], calls


def _data_files(root: Path | str, fs: Any = None) -> list[str]:
    """The file names under data/ (local, or on S3 through ``fs``)."""
    if fs is None:
        return sorted(p.name for p in Path(root, "data").rglob("*") if p.is_file())
    return sorted(p.rsplit("/", 1)[-1] for p in fs.find(str(root).removeprefix("s3://") + "/data"))


@pytest.mark.parametrize("publish", MODES)
def test_a_shards_round_trips_locally(tmp_path: Path, tiny_llm, publish: str) -> None:
    _write_input(tmp_path / "in")
    out = tmp_path / "out"
    calls = _shard_loop_calls(str(tmp_path / "in"), str(out), tiny_llm, {}, counted_calls, publish)
    _check(calls, publish)
    names = _data_files(out)
    assert len(names) == SHARDS and all(
        (n == "part-direct-00000.parquet") == (publish == "direct") for n in names
    )
    assert not [p for p in (out / "_staging").rglob("*") if p.is_file()]


@pytest.mark.parametrize("publish", MODES)
def test_a_shards_round_trips_on_s3(tmp_path: Path, s3_endpoint: str, tiny_llm, publish: str) -> None:
    bucket = f"trips-{uuid.uuid4().hex[:8]}"
    fs = s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint})
    fs.mkdir(bucket)
    _write_input(tmp_path / "in")
    fs.put(str(tmp_path / "in") + "/", f"{bucket}/in/", recursive=True)
    out = f"s3://{bucket}/out"
    calls = _shard_loop_calls(
        f"s3://{bucket}/in", out, tiny_llm, {"endpoint_url": s3_endpoint}, counted_requests, publish
    )
    _check(calls, publish)
    fs.invalidate_cache()
    names = _data_files(out, fs)
    assert len(names) == SHARDS and all(
        (n == "part-direct-00000.parquet") == (publish == "direct") for n in names
    )
    assert not fs.find(f"{bucket}/out/_staging")


def _whole_run(folder: Path, shards: int, llm: Any, publish: str) -> Counter[tuple[str, str]]:
    _write_input(folder / "in", shards)
    out = str(folder / "out")
    spec = load_job(str(folder / "in"), out, "tiny", _job(publish))
    with counted_calls(out, Store.open(out, spec.config.storage)) as calls:
        summary, failures = run_local(spec, llm=llm, progress=False)
    assert not failures and summary.complete and summary.rows == shards
    calls.pop(("write", "_leases"), None)
    return calls


@pytest.mark.parametrize("publish", MODES)
def test_a_whole_run_adds_only_the_shards_own_round_trips_per_shard(
    tmp_path: Path, tiny_llm, publish: str
) -> None:
    """The whole `prefixflow run` path (plan, prepare, the loop, finalize) of 8 shards against 4 shards
    of the same two files: on the output, the 4 more shards cost exactly 4 x PER_SHARD; everything else
    is constant. (The input side is left out: the advisor's prediction samples rows shard by shard.)"""
    small = _whole_run(tmp_path / "small", 4, tiny_llm, publish)
    large = _whole_run(tmp_path / "large", 8, tiny_llm, publish)
    extra = {
        k: large[k] - small[k] for k in set(large) | set(small) if large[k] != small[k] and k[1] != "input"
    }
    assert extra == {k: v * 4 for k, v in PER_SHARD[publish].items() if k[1] != "input"}, (small, large)
