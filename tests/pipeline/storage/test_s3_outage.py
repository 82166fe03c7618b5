"""Issue 22 item 11: the S3 endpoint stalls or goes away (moto's server behind a TCP proxy the test
stalls and stops).

An endpoint that accepted connections but never answered left the run silent for over 5 minutes
(s3fs' 15 s reads x botocore's 5 attempts x s3fs' 5 retries); one refusing connections gave a clear
line but exit 2 ("bad config") and no resume hint. Now S3 calls time out and retry a bounded number of
times, and an outage exits 1 saying that the same command resumes."""

from __future__ import annotations

import io
import socket
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pyarrow.dataset as ds
import pytest
import s3fs
from rich.console import Console

from prefixflow.pipeline.cli import main
from prefixflow.pipeline.job.config import StorageConfig
from prefixflow.pipeline.job.spec import load_job
from prefixflow.pipeline.local_run import run_local
from prefixflow.pipeline.run import shard_execution
from prefixflow.pipeline.storage import slow
from prefixflow.pipeline.storage.errors import transient_problem
from prefixflow.pipeline.storage.slow import SLOW_ENV
from prefixflow.pipeline.storage.slow import in_flight as slow_calls_in_flight
from prefixflow.pipeline.storage.store import S3_CALL_RETRIES, S3_TIMEOUTS, Store, storage_options
from tests.pipeline.support import cli_args, job, write_dataset, write_job

pytestmark = pytest.mark.timeout(300)


class Proxy:
    """A TCP proxy on loopback in front of ``target``: ``forward`` pipes bytes both ways, ``stall``
    accepts connections and never answers, ``stop()`` closes the port (connections are refused),
    ``pause()`` holds every byte in both directions (open connections included) until ``resume()``
    resets them."""

    def __init__(self, target: str) -> None:
        url = urlparse(target)
        self.target = (url.hostname or "127.0.0.1", url.port or 80)
        self.mode = "forward"
        self.held: list[socket.socket] = []
        self.flowing = threading.Event()
        self.flowing.set()
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

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                self.flowing.wait()
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def pause(self) -> None:
        self.flowing.clear()

    def resume(self) -> None:
        """The stall ends: connections open during it are reset (nothing they held is delivered late),
        new ones forward again."""
        held, self.held = self.held, []
        for conn in held:
            conn.close()
        self.flowing.set()

    def stop(self) -> None:
        self.flowing.set()
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


class _Timed(io.StringIO):
    """What the run printed, each write with the time it was made (to place it against the pause)."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[tuple[float, str]] = []

    def write(self, text: str) -> int:
        self.lines.append((time.monotonic(), text))
        return super().write(text)


def test_slow_storage_is_reported_while_it_stalls_and_the_run_completes_once(
    tmp_path: Path, proxy: Proxy, s3_endpoint: str, tiny_llm, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The proxy pauses at the shard's first flush (its direct part PUT into data/ then waits), resumes 2.5 s later: the
    progress log names the slow call and its path while it waits, says storage answers again after, and
    the output holds every row exactly once."""
    monkeypatch.setenv(SLOW_ENV, "0.6")
    bucket = f"b-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir(bucket)
    ids = write_dataset(tmp_path / "in", files=1, rows_per_file=6, row_group_size=6)
    fast = {"config_kwargs": {"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 2}}}
    spec = load_job(
        str(tmp_path / "in"),
        f"s3://{bucket}/out",
        "tiny",
        job("generate", sampling={"max_tokens": 2}),
        endpoint_url=proxy.url,
        storage_options=fast,
    )
    window: list[float] = []

    def pause_once(name: str) -> None:
        if name == "flush_begin" and not window:
            proxy.pause()
            window.append(time.monotonic())
            threading.Timer(2.5, lambda: (window.append(time.monotonic()), proxy.resume())).start()

    monkeypatch.setattr(shard_execution, "hook", pause_once)
    out = _Timed()
    summary, failures = run_local(
        spec, llm=tiny_llm, progress=None, console=Console(file=out, width=400), progress_interval=60
    )
    assert failures == [] and summary.complete and summary.rows == 6
    paused, resumed = window
    slow = [(t, text) for t, text in out.lines if "storage slow" in text]
    stalled = [text for t, text in slow if paused < t < resumed]  # (a loaded host may be slow elsewhere)
    assert stalled, out.getvalue()
    assert any(
        "put_object" in text and f"s3://{bucket}/out/data/" in text and "retrying" in text for text in stalled
    )
    again = [t for t, text in out.lines if "storage answering again" in text]
    assert again, out.getvalue()
    assert again[-1] > resumed and all(t <= again[-1] for t, _ in slow)
    assert slow_calls_in_flight() == []
    table = ds.dataset(
        f"{bucket}/out/data",
        filesystem=s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}),
        format="parquet",
    ).to_table()
    assert sorted(table.column("id").to_pylist()) == sorted(ids)


def test_the_watch_reports_once_per_repeat_and_the_recovery() -> None:
    reports: list[tuple[str, bool]] = []
    watcher = slow._Watcher()
    watcher.reports.append(lambda text, still: reports.append((text, still)))
    with slow.track("get_object", "s3://b/k") as call:
        start = call.started
        watcher.check(start + 1.0)  # under the threshold
        watcher.check(start + slow.DEFAULT_SLOW_S + 0.1)
        watcher.check(start + slow.DEFAULT_SLOW_S + 1.0)  # reported already
        call.attempts = 3
        watcher.check(start + slow.DEFAULT_SLOW_S + slow.REPEAT_S + 0.2)
    watcher.check(start + 40)
    assert [still for _, still in reports] == [True, True, False]
    assert "get_object s3://b/k has not answered for 5.1 s" in reports[0][0]
    assert "attempt 3" in reports[1][0] and "answering again" in reports[2][0]


def test_a_put_on_a_stalled_connection_times_out_and_retries(proxy: Proxy, s3_endpoint: str) -> None:
    """botocore sends PUTs with ``Expect: 100-continue`` and aiohttp waits for the interim answer with no
    timeout: a part or marker PUT over a connection that stalled hung for good (probed: still waiting
    after 30 s with read_timeout 1) while GETs timed out. Now it fails like any other call: retried,
    then a timeout the CLI turns into exit 1 with the resume hint."""
    bucket = f"b-{uuid.uuid4().hex[:8]}"
    s3fs.S3FileSystem(client_kwargs={"endpoint_url": s3_endpoint}).mkdir(bucket)
    fast = {"connect_timeout": 1, "read_timeout": 1, "retries": {"max_attempts": 1, "mode": "standard"}}
    store = Store.open(
        f"s3://{bucket}/x", StorageConfig(endpoint_url=proxy.url, options={"config_kwargs": fast})
    )
    store.write_atomic(f"{bucket}/x/warm", b"1")  # a pooled connection, as mid-run
    proxy.pause()
    failed: list[BaseException] = []
    attempts: list[int] = []

    def put() -> None:
        try:
            store.write_atomic(f"{bucket}/x/part", b"2")
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            failed.append(exc)

    worker = threading.Thread(target=put, daemon=True)
    worker.start()
    while worker.is_alive() and len(attempts) < 600:
        attempts += [max((c.attempts for c in slow_calls_in_flight()), default=0)]
        worker.join(0.1)
    assert not worker.is_alive(), "the PUT never timed out"
    assert failed and transient_problem(failed[0]) is not None and max(attempts) >= 2
