"""A real multi-node Ray cluster on this machine, for the slow cluster tests.

Each node is its own `ray start --block` process tree (GCS on the head, a raylet, an object store and
its workers on every node) bound to its own loopback address: the head on 127.0.0.2, further nodes on
127.0.0.3, 127.0.0.4 ... (Linux routes all of 127/8 to the loopback device; Ray rewrites 127.0.0.1 to
the host's public address, the other loopback addresses it keeps). No network namespaces: they need
root and `ip netns`, which CI need not have. The cluster is not discoverable by other processes: every
node has its own `--temp-dir` (under a short folder of /tmp: Ray's socket paths are limited), its own ports, and RAY_ADDRESS is never set
in this process; the tests pass the address to the flow as `ray_address`. Small: one CPU per node,
100 MB object stores, no dashboard. `stop()` kills every process of every node, also after a failure.
"""

from __future__ import annotations

import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from tests.flows.support import env_with_repo_on_path

OBJECT_STORE_BYTES = 100 * 10**6


def process_tree(pid: int) -> list[psutil.Process]:
    """The process `pid` and all its descendants (empty once it is gone)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def signal_all(procs: list[psutil.Process], sig: int) -> list[psutil.Process]:
    """Send `sig` to each of `procs` (those already gone are skipped); returns them."""
    for p in procs:
        try:
            p.send_signal(sig)
        except psutil.NoSuchProcess:
            pass
    return procs


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


@dataclass
class RayNode:
    ip: str
    proc: subprocess.Popen[bytes]
    temp_dir: Path
    log: Path

    def processes(self) -> list[psutil.Process]:
        """The node's `ray start` process and everything it started (raylet, agents, workers)."""
        return process_tree(self.proc.pid)

    def kill(self, sig: int = signal.SIGKILL) -> int:
        return len(signal_all(self.processes(), sig))

    def worker_logs(self) -> list[Path]:
        return sorted(self.temp_dir.glob("session_*/logs/worker-*.err"))


@dataclass
class LocalRayCluster:
    root: Path
    env: dict[str, str] = field(default_factory=dict)  # extra environment of every node (and its workers)
    port: int = 0
    nodes: list[RayNode] = field(default_factory=list)

    @property
    def address(self) -> str:
        return f"127.0.0.2:{self.port}"

    def start(self, workers: int = 1, node_env: dict[str, str] | None = None) -> LocalRayCluster:
        """The head plus `workers` nodes, each with one `lane` resource; `node_env` only on the workers."""
        self.port = free_port("127.0.0.2")
        self.nodes.append(self._start_node("127.0.0.2", head=True))
        self._wait_started(self.nodes[0])
        for i in range(workers):
            self.add_node(f"127.0.0.{3 + i}", node_env)
        return self

    def add_node(self, ip: str, node_env: dict[str, str] | None = None) -> RayNode:
        node = self._start_node(ip, head=False, node_env=node_env)
        self.nodes.append(node)
        self._wait_started(node)
        return node

    def _start_node(self, ip: str, head: bool, node_env: dict[str, str] | None = None) -> RayNode:
        temp = self.root / f"n{len(self.nodes)}"  # short: Ray's socket paths must stay under 108 bytes
        temp.mkdir(parents=True, exist_ok=True)
        # the `ray` console script of this interpreter's Ray (a PATH lookup could find another one)
        args = [
            sys.executable,
            "-m",
            "ray.scripts.scripts",
            "start",
            "--block",
            f"--node-ip-address={ip}",
            "--num-cpus=1",
            "--num-gpus=0",
            f"--resources={json.dumps({'lane': 1})}",
            f"--object-store-memory={OBJECT_STORE_BYTES}",
            f"--temp-dir={temp}",
            f"--dashboard-agent-listen-port={free_port(ip)}",
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--disable-usage-stats",
        ]
        if head:
            args += [
                "--head",
                f"--port={self.port}",
                f"--ray-client-server-port={free_port(ip)}",
                "--include-dashboard=false",
                f"--dashboard-port={free_port(ip)}",
            ]
        else:
            args.append(f"--address={self.address}")
        env = env_with_repo_on_path()
        env.pop("RAY_ADDRESS", None)
        # HOME: a ~/.ray/auth_token that some other Ray run left on this machine must not turn on token
        # auth for half of the cluster (the nodes then refuse each other)
        env.update(
            RAY_USAGE_STATS_ENABLED="0",
            RAY_AUTH_MODE="disabled",
            HOME=str(self.root),
            **self.env,
            **(node_env or {}),
        )
        log = temp / "ray-start.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                args, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        return RayNode(ip, proc, temp, log)

    @staticmethod
    def _wait_started(node: RayNode, timeout_s: float = 120) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            text = node.log.read_text(errors="replace") if node.log.exists() else ""
            if "block forever" in text:
                return
            if node.proc.poll() is not None:
                raise RuntimeError(f"ray start on {node.ip} exited {node.proc.returncode}:\n{text[-3000:]}")
            time.sleep(0.5)
        raise TimeoutError(
            f"ray start on {node.ip} did not come up in {timeout_s}s:\n{node.log.read_text()[-3000:]}"
        )

    def stop(self) -> None:
        """Stop every node (SIGTERM, then SIGKILL what is left); safe to call twice."""
        for node in reversed(self.nodes):
            node.kill(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for node in reversed(self.nodes):
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            node.kill(signal.SIGKILL)
            try:
                node.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        self.nodes.clear()


def wait_for_log(paths: Callable[[], list[Path]], pattern: list[str], timeout_s: float) -> Path:
    """Wait until one of the files `paths()` holds the lines of `pattern` in that order; return it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for path in paths():
            text = path.read_text(errors="replace")
            at = 0
            for needle in pattern:
                at = text.find(needle, at)
                if at < 0:
                    break
                at += len(needle)
            else:
                return path
        time.sleep(0.2)
    raise TimeoutError(f"no log showed {pattern} within {timeout_s}s")
