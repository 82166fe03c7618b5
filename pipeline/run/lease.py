"""Leases on an output root: which live processes write it, so `--new-run` never discards a running job.

Every process that writes an output keeps one lease object ``OUTPUT/_leases/<holder>.json`` (shared by
its threads), renewed in the background every ``ttl/4`` seconds and deleted when it is done. A lease is
*shared* (writing the current run; any number at once) or *exclusive* (a --new-run replacing it).

S3 has no rename and no lock, so the protocol uses only whole-object writes and listings (both strongly
consistent on S3): a process first writes its own lease, then lists the others. A shared holder backs off
if it sees a live exclusive lease; an exclusive holder backs off if it sees any other live lease. Of two
processes that start together at least one sees the other, so a --new-run and a writer never both go on.

One holder per output is the run's *driver*: the process that plans and finishes a run (`prefixflow run`, the
flow's process). A driver also backs off if it sees another live driver, so two runs of a job never write one
output at once (they would only race for its shards); lanes in other processes (Ray workers) hold plain
shared leases and never conflict with their driver. A driver lease names its run (``driver``, and ``ref`` for
the orchestrator, e.g. a Prefect flow run id); a dead driver lease found on the way is handed to the new
driver (``dead_drivers``), so it can report the run that died.

A lease is live until ``ttl_s`` after the storage last wrote it, by the storage's own clock: the listing's
``LastModified`` (S3) or ``mtime`` (a filesystem) of the other lease, against that of the reader's own
lease, written just before. No two machines' clocks are ever compared, so a writer whose clock runs behind
(or ahead) is neither taken for dead nor kept alive. Only a store that reports no timestamps falls back to
``renewed_at`` (the writer's clock) against the reader's clock. On the holder's own machine a lease whose
process has exited is dead at once, so a killed run does not block the next command for a whole TTL.

A holder also knows from its own monotonic clock how long every reader must still take its lease for live
(``covers``): while it has been so without a gap since a Run read the run record, no --new-run can have
replaced that run, and a commit needs no re-read of the record (run/handle.py).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace

from prefixflow.pipeline.errors import OutputBusy
from prefixflow.pipeline.storage.layout import Layout
from prefixflow.pipeline.storage.store import modified_at

LEASE_TTL_S = float(os.environ.get("PREFIXFLOW_LEASE_TTL_S", "60"))
SHARED, EXCLUSIVE = "shared", "exclusive"
_log = logging.getLogger(__name__)


def _machine_id() -> str:
    """The boot and pid namespace of this process: two processes share it only if one's pid is
    meaningful to the other (same host, same container)."""
    parts = []
    for path in ("/proc/sys/kernel/random/boot_id", "/proc/self/ns/pid"):
        try:
            parts.append(open(path).read().strip() if path.endswith("boot_id") else str(os.stat(path).st_ino))
        except OSError:
            parts.append("?")
    return f"{socket.gethostname()}/{'/'.join(parts)}"


MACHINE = _machine_id()


@dataclass(frozen=True)
class Lease:
    """One holder's lease as stored in ``_leases/<holder>.json``."""

    holder: str
    mode: str
    machine: str
    host: str
    pid: int
    renewed_at: float
    ttl_s: float
    command: str = ""
    driver: str = ""  # the run this holder drives ("" for a lane or a helper writer)
    ref: str = ""  # the driver's run for its orchestrator (e.g. "prefect-flow-run:<id>")
    written: float | None = None  # the storage's timestamp of the lease object (from the listing), not stored
    seen_at: float | None = (
        None  # the reader's "now" on the clock of ``renewed`` (set by ``others``), not stored
    )

    @property
    def renewed(self) -> float:
        """When the lease was last written: by the storage's clock, else (no timestamps) the writer's."""
        return self.written if self.written is not None else self.renewed_at

    def live(self, now: float) -> bool:
        """``now``: the reader's time on the same clock as ``renewed`` (see ``OutputLease.others``)."""
        if self.machine == MACHINE and not _pid_alive(self.pid):
            return False
        return now < self.renewed + self.ttl_s

    def describe(self) -> str:
        now = self.seen_at if self.seen_at is not None else time.time()
        left = max(0.0, self.renewed + self.ttl_s - now)
        what = f" ({self.command})" if self.command else ""
        run = f", driving {self.driver}" if self.driver else ""
        return f"pid {self.pid} on {self.host}{what}{run}, renewed {now - self.renewed:.0f}s ago, expires in {left:.0f}s"


def _margin(ttl_s: float) -> float:
    """How much sooner than ``ttl_s`` a holder stops counting on its lease: S3 timestamps are whole seconds
    (the holder's and the reader's object each lose up to one), and clocks may run at slightly other rates."""
    return 2.0 + 0.02 * ttl_s


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class OutputLease:
    """This process's lease on one output root; hold it with ``hold(layout)``."""

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.holder = f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.mode = SHARED
        self.users = 0
        self.driver = self.ref = ""
        self.dead_drivers: list[Lease] = []  # driver leases of runs that died, seen while this one was taken
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._live: tuple[float, float] | None = None  # (since, until), monotonic: see covers()
        self._live_lock = threading.Lock()

    @property
    def path(self) -> str:
        return self.layout.path("_leases", f"{self.holder}.json")

    def write(self) -> None:
        import sys

        lease = Lease(
            self.holder,
            self.mode,
            MACHINE,
            socket.gethostname(),
            os.getpid(),
            time.time(),
            LEASE_TTL_S,
            " ".join(os.path.basename(a) for a in sys.argv[:2]),
            self.driver,
            self.ref,
        )
        body = asdict(lease)
        del body["written"], body["seen_at"]
        started = time.monotonic()
        self.layout.store.write_atomic(self.path, json.dumps(body).encode())
        done = time.monotonic()
        with self._live_lock:  # live for every reader from `done` (at the latest) to started + TTL
            since = self._live[0] if self._live is not None and done <= self._live[1] else done
            self._live = (since, started + LEASE_TTL_S - _margin(LEASE_TTL_S))

    def covers(self, since: float) -> bool:
        """True when every reader has taken this lease for live, without a gap, from ``since``
        (``time.monotonic()``) until now: then no --new-run can have replaced the run meanwhile."""
        with self._live_lock:
            return self._live is not None and self._live[0] <= since and time.monotonic() < self._live[1]

    def others(self) -> list[Lease]:
        """The live leases of other holders; dead ones are removed on the way (harmless if repeated).
        "Now" is the storage's timestamp of this holder's own lease (written just before, or at the
        last renewal: then others look live a little longer, never shorter)."""
        leases = self.layout.store.listing(self.layout.path("_leases"))
        if self.path not in leases:
            self.write()
            leases = self.layout.store.listing(self.layout.path("_leases"))
        own = modified_at(leases[self.path]) if self.path in leases else None
        found: list[Lease] = []
        for path, info in leases.items():
            if path == self.path or not path.endswith(".json"):
                continue
            written = modified_at(info) if own is not None else None
            try:
                lease = Lease(**json.loads(self.layout.store.read_bytes(path)), written=written)
            except (OSError, ValueError, TypeError):
                continue  # vanished while listing, or not a lease: not a live holder
            now = own if written is not None and own is not None else time.time()
            lease = replace(lease, seen_at=now)
            if lease.live(now):
                found.append(lease)
                continue
            if lease.driver and self.driver and lease.holder not in {d.holder for d in self.dead_drivers}:
                self.dead_drivers.append(lease)
            if now > lease.renewed + 2 * lease.ttl_s or lease.machine == MACHINE:
                self.layout.store.remove(path)
        return found

    def acquire_shared(self) -> None:
        self.mode = SHARED
        self.write()
        blocking = [lease for lease in self.others() if lease.mode == EXCLUSIVE]
        if blocking:
            self.release()
            raise OutputBusy(
                f"output {self.layout.store.root}: a --new-run is replacing the run there "
                f"({blocking[0].describe()}); run this command again once it has started"
            )
        self._start_renewing()

    def drive(self, driver: str, ref: str = "") -> None:
        """Make this (held) lease the output's driver lease for the run ``driver``; OutputBusy while another
        live process drives a run there."""
        if self.driver == driver:
            return
        if self.driver:
            raise OutputBusy(
                self._busy_message(f"pid {os.getpid()} on {socket.gethostname()}, driving {self.driver}")
            )
        self.driver, self.ref = driver, ref
        self.write()
        rivals = [lease for lease in self.others() if lease.driver]
        if rivals:
            self.driver = self.ref = ""
            self.write()
            rival = rivals[0]
            raise OutputBusy(self._busy_message(rival.describe()))

    def _busy_message(self, holder: str) -> str:
        return (
            f"output {self.layout.store.root} is already being written by another run of a job: {holder}. "
            "Two runs into one output would only race for its shards, so this one does not start: wait for "
            "that run to finish (prefixflow status shows its progress), stop it, or write to another output. "
            "A killed run's lease expires once it is no longer renewed (on its own machine at once)"
        )

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        """Hold the output alone for the block (a --new-run): refuse while any other process writes it.
        Also ends the lease's live stretch (``covers``): a Run of this process opened before may have been
        replaced here, so it must read the record again."""
        self.mode = EXCLUSIVE
        with self._live_lock:
            self._live = None
        self.write()
        others = self.others()
        if others:
            self.mode = SHARED
            self.write()
            listed = "; ".join(lease.describe() for lease in others[:3])
            raise OutputBusy(
                f"output {self.layout.store.root} is in use by {len(others)} other run(s): {listed}. "
                "--new-run would discard what they write: wait for them to finish, or stop them (a killed "
                "run's lease expires once it is not renewed; on this machine at once)"
            )
        try:
            yield
        finally:
            self.mode = SHARED
            self.write()

    def _start_renewing(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew, name="prefixflow-lease", daemon=True)
        self._thread.start()

    def _renew(self) -> None:
        while not self._stop.wait(LEASE_TTL_S / 4):
            try:
                self.write()
            except Exception as exc:  # noqa: BLE001 - a missed renewal is retried; the lease may expire
                _log.warning("could not renew the lease %s: %s", self.path, exc)

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)
        self._thread = None
        with self._live_lock:
            self._live = None
        try:
            self.layout.store.remove(self.path)
        except Exception as exc:  # noqa: BLE001 - an unremoved lease expires on its own
            _log.warning("could not remove the lease %s: %s", self.path, exc)


_HELD: dict[str, OutputLease] = {}
_HELD_LOCK = threading.Lock()


def held(layout: Layout) -> OutputLease | None:
    """This process's lease on ``layout``'s root while some ``hold`` holds it, else None."""
    with _HELD_LOCK:
        return _HELD.get(layout.store.url(layout.store.root))


@contextmanager
def hold(layout: Layout, driver: str = "", ref: str = "") -> Iterator[OutputLease]:
    """This process's shared lease on ``layout``'s root for the block; nested and concurrent holds (threads,
    lanes) share one lease object, released when the last one exits. Raises OutputBusy while a --new-run
    replaces the output. With ``driver`` (a run's name) the lease is also the output's driver lease (see the
    module docstring): OutputBusy while another process drives a run into this output."""
    key = layout.store.url(layout.store.root)
    with _HELD_LOCK:
        lease = _HELD.get(key)
        fresh = lease is None
        if lease is None:
            lease = OutputLease(layout)
            lease.driver, lease.ref = driver, ref
            lease.acquire_shared()
        took = bool(driver) and (fresh or not lease.driver)  # this hold makes the lease a driver lease
        try:
            if driver:
                rivals = [other for other in lease.others() if other.driver] if fresh else []
                if rivals:
                    raise OutputBusy(lease._busy_message(rivals[0].describe()))
                lease.drive(driver, ref)
        except BaseException:
            if fresh:
                lease.release()
            raise
        _HELD[key] = lease
        lease.users += 1
    try:
        yield lease
    finally:
        with _HELD_LOCK:
            lease.users -= 1
            if lease.users == 0:
                del _HELD[key]
                lease.release()
            elif took:  # the run is over; a lane thread still holding the lease does not keep driving it
                lease.driver = lease.ref = ""
                lease.write()
