"""Fixtures for the flow tests: one Prefect test server per session (and a real `prefect server start` for
the worker tests), a small dataset per test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.flows.prefect_server import PrefectServer, running_server
from tests.flows.support import write_dataset


@pytest.fixture(scope="session")
def prefect_server() -> Iterator[str]:
    """A temporary Prefect API server (SQLite) shared by every flow test; yields its API URL."""
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield PREFECT_API_URL.value()


@pytest.fixture
def dataset(tmp_path: Path) -> tuple[Path, list[str]]:
    return tmp_path / "in", write_dataset(tmp_path / "in")


@pytest.fixture(autouse=True)
def _no_stray_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFIXFLOW_FAULT_ONCE", raising=False)


@pytest.fixture(scope="session")
def real_prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """`prefect server start` on loopback (tests/flows/prefect_server.py), one per session; its workers
    and the server are stopped, whole process groups, at the end, also after a failure."""
    with running_server(tmp_path_factory.mktemp("prefect-server")) as server:
        yield server
