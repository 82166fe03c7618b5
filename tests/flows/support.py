"""Helpers shared by the flow tests: the dataset, exactly-once checks, Prefect API queries."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]

# Small engine settings for the random `tiny` preset: a few output tokens, a small KV pool.
JOB: dict[str, Any] = {
    "id_column": "id",
    "prompt_column": "prompt",
    "sampling": {"max_tokens": 4, "temperature": 0.0},
    "engine": {"max_model_len": 256, "max_num_seqs": 16, "kv_cache_memory_bytes": 16 * 2**20},
}
SHARD_ROWS = 4
NUM_SHARDS = 5  # 12 rows + 8 rows in row groups of 4
EMPTY_PROMPT_IDS = {"b-03"}


def pipeline_ready() -> bool:
    """True once the pipeline package exports the functions the flows call."""
    try:
        from prefixflow import pipeline
    except ImportError:
        return False
    return all(hasattr(pipeline, n) for n in ("load_job", "plan_shards", "run_shard", "finalize"))


requires_pipeline = pytest.mark.skipif(not pipeline_ready(), reason="pipeline package has not landed yet")


def write_dataset(root: Path) -> list[str]:
    """Two Parquet files (12 + 8 rows, row groups of 4), one empty prompt; returns the ids."""
    root.mkdir(parents=True, exist_ok=True)
    ids: list[str] = []
    for name, n in (("a", 12), ("b", 8)):
        rows = [f"{name}-{i:02d}" for i in range(n)]
        prompts = [
            "" if rid in EMPTY_PROMPT_IDS else f"Question about item {name}{i}: what is {i} plus {i}?"
            for i, rid in enumerate(rows)
        ]
        pq.write_table(pa.table({"id": rows, "prompt": prompts}), root / f"{name}.parquet", row_group_size=4)
        ids += rows
    return ids


def committed_table(output: Path) -> pa.Table:
    """Everything a reader sees in the committed output (`OUTPUT/data/**/*.parquet`)."""
    return ds.dataset(str(output / "data"), format="parquet").to_table()


def assert_exactly_once(output: Path, ids: list[str]) -> pa.Table:
    table = committed_table(output)
    got = table.column("id").to_pylist()
    assert len(got) == len(set(got)), f"duplicate ids in output: {sorted(got)}"
    assert sorted(got) == sorted(ids)
    return table


def env_with_repo_on_path() -> dict[str, str]:
    """The current environment with the repository importable (for subprocesses and Ray workers)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env


async def read_artifacts(flow_run_id: Any) -> dict[str, Any]:
    """The flow run's artifacts by key, read through the Prefect API."""
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    async with get_client() as client:
        arts = await client.read_artifacts(
            artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id]))
        )
    return {a.key: a for a in arts}


async def read_lane_runs(flow_run_id: Any) -> list[Any]:
    """The flow run's lane task runs, by name, read through the Prefect API."""
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    async with get_client() as client:
        runs = await client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id]))
        )
    return sorted((r for r in runs if r.name.startswith("lane-")), key=lambda r: r.name)


def read_limit(name: str) -> Any | None:
    """The global concurrency limit `name`, or None if it does not exist."""
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None


def delete_limit(name: str) -> None:
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            client.delete_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            pass


def hold_intervals(lanes: list[dict[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """Per device limit, the sorted (held_from, held_until) of every lane that held it."""
    spans: dict[str, list[tuple[float, float]]] = {}
    for lane in lanes:
        for name in lane["devices"]:
            spans.setdefault(name, []).append((lane["held_from"], lane["held_until"]))
    return {name: sorted(s) for name, s in spans.items()}


def assert_never_shared(spans: dict[str, list[tuple[float, float]]]) -> None:
    for name, s in spans.items():
        overlaps = [(a, b) for a, b in zip(s, s[1:]) if b[0] < a[1]]
        assert not overlaps, f"two lanes held {name} at once: {overlaps}"
