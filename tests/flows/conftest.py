"""Shared fixtures for the flow tests: one Prefect test server per session, a small dataset."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

# Small engine settings for the random `tiny` preset: a few output tokens, a small KV pool.
JOB: dict[str, Any] = {
    "id_column": "id",
    "prompt_column": "prompt",
    "sampling": {"max_tokens": 4, "temperature": 0.0},
    "engine": {"max_model_len": 256, "max_num_seqs": 16, "kv_cache_memory_bytes": 16 * 2**20},
}
SHARD_ROWS = 4
EMPTY_PROMPT_IDS = {"b-03"}


def pipeline_ready() -> bool:
    """True once the pipeline package exports the functions the flows call."""
    try:
        import pipeline
    except ImportError:
        return False
    return all(hasattr(pipeline, n) for n in ("load_job", "plan_shards", "run_shard", "finalize"))


requires_pipeline = pytest.mark.skipif(not pipeline_ready(), reason="pipeline package has not landed yet")


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """A temporary Prefect API server (SQLite) shared by every flow test; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield PREFECT_API_URL.value()


def write_dataset(root: Path) -> list[str]:
    """Two Parquet files (12 + 8 rows, row groups of 4) with shared prompt prefixes; returns ids."""
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


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, list[str]]:
    return tmp_path / "in", write_dataset(tmp_path / "in")


def committed_table(output: Path) -> pa.Table:
    """Everything a reader sees in the committed output (`OUTPUT/data/**/*.parquet`)."""
    return ds.dataset(str(output / "data"), format="parquet").to_table()


def assert_exactly_once(output: Path, ids: list[str]) -> pa.Table:
    table = committed_table(output)
    got = table.column("id").to_pylist()
    assert len(got) == len(set(got)), f"duplicate ids in output: {sorted(got)}"
    assert sorted(got) == sorted(ids)
    return table


@pytest.fixture(autouse=True)
def _no_stray_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFIXFLOW_FAULT_ONCE", raising=False)


def env_with_repo_on_path() -> dict[str, str]:
    """The current environment with the repository importable (for subprocesses and Ray workers)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)
    return env
