"""A real `prefect server start` on loopback, and `prefect worker start` processes, for the worker tests.

The server is the `prefect server start` command itself (not prefect_test_harness's in-process ASGI
server): its own PREFECT_HOME and SQLite database under a temporary folder, a free port on 127.0.0.1, no
UI, no telemetry or analytics. Ready once `GET /api/health` answers. Every process here runs in its own
session (process group); `stop()` signals the whole group (SIGTERM, then SIGKILL), so a flow-run
subprocess a worker started goes too, also when the test failed. Use `api()` to point this process's
Prefect client at the server for a block.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.flows.ray_cluster import free_port, process_tree, signal_all
from tests.flows.support import REPO, env_with_repo_on_path

STARTUP_TIMEOUT_S = float(os.environ.get("PREFIXFLOW_TEST_SERVER_TIMEOUT_S", "240"))
# SQLite under a loaded host: wait for the write lock instead of answering 500 "database is locked", and
# leave off the background services no test here needs (each one is another writer)
SERVER_SETTINGS = {
    "PREFECT_SERVER_DATABASE_TIMEOUT": "60",
    **{
        f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
        for name in (
            "FOREMAN",
            "LATE_RUNS",
            "PAUSE_EXPIRATIONS",
            "CANCELLATION_CLEANUP",
            "CLEANUP_RECONCILER",
            "TRIGGERS",
        )
    },
}


def quiet_prefect_env(home: Path, api_url: str | None = None) -> dict[str, str]:
    """The environment of a Prefect process here: the repository importable, its own PREFECT_HOME, no
    telemetry, and (for clients) the server's API URL; nothing inherited that points elsewhere."""
    env = env_with_repo_on_path()
    for name in list(env):
        if name.startswith("PREFECT_"):
            del env[name]
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_CLI_PROMPT="false",
        DO_NOT_TRACK="1",
        PYTHONUNBUFFERED="1",
    )
    if api_url:
        env["PREFECT_API_URL"] = api_url
    return env


@dataclass
class Managed:
    """A process started in its own session; `stop()` ends its whole process group."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path

    def processes(self) -> list[psutil.Process]:
        return process_tree(self.proc.pid)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def kill_tree(self, sig: int = signal.SIGKILL) -> list[int]:
        """Send `sig` to the process, its group and every descendant (one that left the group too)."""
        procs = self.processes()
        try:
            os.killpg(self.proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
        return [p.pid for p in signal_all(procs, sig)]

    def stop(self, grace_s: float = 10) -> None:
        if self.proc.poll() is None or self.processes():
            self.kill_tree(signal.SIGTERM)
            try:
                self.proc.wait(timeout=grace_s)
            except subprocess.TimeoutExpired:
                pass
        self.kill_tree(signal.SIGKILL)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


def spawn(name: str, args: list[str], env: dict[str, str], log: Path, cwd: Path = REPO) -> Managed:
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return Managed(name, proc, log)


@dataclass
class PrefectServer:
    """`prefect server start` in `root`; `start()` returns once the API answers its health check."""

    root: Path
    port: int = 0
    server: Managed | None = None
    workers: list[Managed] = field(default_factory=list)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> PrefectServer:
        self.port = free_port("127.0.0.1")
        home = self.root / "server-home"
        env = quiet_prefect_env(home)
        env.update(
            PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{self.root / 'prefect.db'}",
            PREFECT_UI_ENABLED="false",
            PREFECT_SERVER_UI_ENABLED="false",
            PREFECT_SERVER_LOGGING_LEVEL="WARNING",
            **SERVER_SETTINGS,
        )
        args = [
            sys.executable,
            "-m",
            "prefect",
            "server",
            "start",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--no-ui",
            "--analytics-off",
        ]
        self.server = spawn("prefect-server", args, env, self.root / "server.log")
        try:
            self._wait_healthy(timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self, timeout_s: float) -> None:
        assert self.server is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.server.proc.poll() is not None:
                raise RuntimeError(
                    f"prefect server start exited {self.server.proc.returncode}:\n{self.server.text()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=5) as response:
                    if response.status == 200 and response.read().strip() == b"true":
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(
            f"prefect server on port {self.port} not healthy in {timeout_s}s:\n{self.server.text()[-3000:]}"
        )

    def client_env(self, name: str) -> dict[str, str]:
        """The environment of a client process (worker, CLI) of this server; its own PREFECT_HOME."""
        return quiet_prefect_env(self.root / f"home-{name}", self.api_url)

    def cli(self, *args: str, timeout_s: float = 180) -> subprocess.CompletedProcess[str]:
        """`prefect ARGS` (or `prefixflow ARGS` when args[0] is "prefixflow") against this server."""
        module = ["-m", "prefixflow.flows.cli"] if args[0] == "prefixflow" else ["-m", "prefect"]
        argv = [sys.executable, *module, *(args[1:] if args[0] == "prefixflow" else args)]
        return subprocess.run(
            argv,
            cwd=REPO,
            env=self.client_env("cli"),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )

    def start_worker(
        self, pool: str, name: str, limit: int | None = None, env: dict[str, str] | None = None
    ) -> Managed:
        """`prefect worker start --pool POOL --type process` polling every second; `limit`: flow runs at once."""
        worker_env = self.client_env(name)
        worker_env.update(
            PREFECT_WORKER_QUERY_SECONDS="1", PREFECT_WORKER_PREFETCH_SECONDS="0", **(env or {})
        )
        args = [
            sys.executable,
            "-m",
            "prefect",
            "worker",
            "start",
            "--pool",
            pool,
            "--name",
            name,
            "--type",
            "process",
            "--install-policy",
            "never",
            *(["--limit", str(limit)] if limit else []),
        ]
        worker = spawn(name, args, worker_env, self.root / f"{name}.log")
        self.workers.append(worker)
        return worker

    def stop(self) -> None:
        """Stop the workers (and the flow runs they started), then the server; safe to call twice."""
        for worker in reversed(self.workers):
            worker.stop()
        self.workers.clear()
        if self.server is not None:
            self.server.stop()

    @contextmanager
    def api(self) -> Iterator[str]:
        """This process's Prefect client talks to this server inside the block."""
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.api_url}):
            yield self.api_url


@contextmanager
def running_server(root: Path) -> Iterator[PrefectServer]:
    server = PrefectServer(root)
    try:
        yield server.start()
    finally:
        server.stop()
