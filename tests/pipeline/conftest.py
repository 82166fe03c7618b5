"""Fixtures: one tiny engine per session, and a real S3 endpoint (moto's server) on loopback."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.pipeline.support import ENGINE, MODEL


@pytest.fixture(scope="session")
def tiny_llm():
    """The random tiny preset with the tests' small settings, loaded once (loading costs seconds)."""
    from prefixflow.engine import LLM

    return LLM(model=MODEL, **ENGINE)


@pytest.fixture(scope="session")
def s3_endpoint() -> Iterator[str]:
    """A moto S3 server on a free loopback port, reached over HTTP; dummy credentials in the env."""
    from moto.server import ThreadedMotoServer

    saved = {
        k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_DEFAULT_REGION")
    }
    os.environ.update(
        AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1"
    )
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(autouse=True)
def _no_test_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PREFIXFLOW_TEST_HOOKS", raising=False)
