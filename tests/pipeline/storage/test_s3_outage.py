"""Issue 22 item 11: the S3 endpoint stalls or goes away (moto's server behind a TCP proxy the test
stalls and stops).

An endpoint that accepted connections but never answered left the run silent for over 5 minutes
(s3fs' 15 s reads x botocore's 5 attempts x s3fs' 5 retries); one refusing connections gave a clear
line but exit 2 ("bad config") and no resume hint. Now S3 calls time out and retry a bounded number of
times, and an outage exits 1 saying that the same command resumes."""

from __future__ import annotations

import socket
import threading
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
import s3fs

from prefixflow.pipeline.cli import main
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.storage.store import S3_CALL_RETRIES, S3_TIMEOUTS, Store, storage_options
from tests.pipeline.support import cli_args, job, write_dataset, write_job

pytestmark = pytest.mark.timeout(300)


class Proxy:
    """A TCP proxy on loopback in front of ``target``: ``forward`` pipes bytes both ways, ``stall``
    accepts connections and never answers, ``stop()`` closes the port (connections are refused)."""

    def __init__(self, target: str) -> None:
        url = urlparse(target)
        self.target = (url.hostname or "127.0.0.1", url.port or 80)
        self.mode = "forward"
        self.held: list[socket.socket] = []
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _start(self) -> None:
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            self.held.append(conn)
            if self.mode == "forward":
                upstream = socket.create_connection(self.target)
                self.held.append(upstream)
                for a, b in ((conn, upstream), (upstream, conn)):
                    threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def stop(self) -> None:
        self.listener.close()
        for conn in self.held:
            conn.close()
        self.held.clear()

    def restart(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", self.port))
        self._start()


@pytest.fixture
def proxy(s3_endpoint: str):
    p = Proxy(s3_endpoint)
    yield p
    p.stop()


def _job(tmp_path: Path, proxy: Proxy, s3_endpoint: str) -> list[str]:
    bucket = f"b-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir(bucket)
    write_dataset(tmp_path / "in", files=1, rows_per_file=3, row_group_size=3)
    cfg = write_job(tmp_path / "job.yaml", job("generate", sampling={"max_tokens": 2}))
    fast = "config_kwargs={connect_timeout: 1, read_timeout: 1, retries: {max_attempts: 2, mode: standard}}"
    return cli_args(
        tmp_path / "in", f"s3://{bucket}/out", cfg, "--endpoint-url", proxy.url, "--storage-option", fast
    )


def test_s3_calls_have_bounded_timeouts_and_retries_by_default() -> None:
    opts = storage_options("s3://bucket/x", StorageConfig(endpoint_url="http://127.0.0.1:9"))
    config = opts["config_kwargs"]
    assert (
        config["connect_timeout"] <= 10
        and config["read_timeout"] <= 30
        and config["retries"]["max_attempts"] <= 3
    )
    mine = storage_options("s3://bucket/x", StorageConfig(options={"config_kwargs": {"read_timeout": 120}}))
    assert mine["config_kwargs"]["read_timeout"] == 120 and mine["config_kwargs"]["connect_timeout"] == 5
    assert (
        Store.open("s3://bucket/x", StorageConfig(endpoint_url="http://127.0.0.1:9")).fs.retries
        == S3_CALL_RETRIES
    )
    assert "config_kwargs" not in storage_options("/tmp/x", StorageConfig())


def test_making_an_s3_client_leaves_the_default_retries_intact() -> None:
    """s3fs' client (botocore's Config) rewrites its `retries` dict in place; the shared defaults must not
    be that dict (a full test run failed test_s3_calls_have_bounded_timeouts... with KeyError 'max_attempts')."""
    Store.open("s3://bucket/x", StorageConfig(endpoint_url="http://127.0.0.1:9")).fs.connect()
    assert S3_TIMEOUTS["retries"]["max_attempts"] == 2
    assert storage_options("s3://bucket/x", StorageConfig())["config_kwargs"]["retries"]["max_attempts"] == 2


def test_a_stalled_endpoint_fails_the_command_with_the_resume_hint(
    tmp_path: Path, proxy: Proxy, s3_endpoint: str, capsys
) -> None:
    args = _job(tmp_path, proxy, s3_endpoint)
    proxy.mode = "stall"
    assert main(args) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "Traceback" not in err and "timeout" in err.lower() and "run the same command again to resume" in err
    )


@pytest.mark.slow
def test_an_outage_exits_1_and_the_same_command_resumes_once_it_is_back(
    tmp_path: Path, proxy: Proxy, s3_endpoint: str, capsys
) -> None:
    args = _job(tmp_path, proxy, s3_endpoint)
    proxy.stop()  # connections refused
    assert main(args) == 1
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "Traceback" not in err
        and "cannot be reached" in err
        and "run the same command again to resume" in err
    )
    proxy.restart()
    assert main(args) == 0
