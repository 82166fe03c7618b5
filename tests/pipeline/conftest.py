"""Fixtures: one tiny engine per session (the S3 endpoint fixture is in tests/conftest.py)."""

from __future__ import annotations

import pytest

from tests.pipeline.support import ENGINE, MODEL


@pytest.fixture(scope="session")
def tiny_llm():
    """The random tiny preset with the tests' small settings, loaded once (loading costs seconds)."""
    from prefixflow.engine import LLM

    return LLM(model=MODEL, **ENGINE)


@pytest.fixture(autouse=True)
def _no_test_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFIXFLOW_TEST_HOOKS", raising=False)
