"""Slow storage, made visible: which S3 call is waiting, for how long, and that it is being retried.

A stalled endpoint used to leave a run silent until its timeouts ran out (issue 22 item 11). Every S3
call of an instrumented filesystem (``instrument``: s3fs funnels all its requests through ``_call_s3``)
is tracked while in flight, with the number of HTTP attempts botocore made for it. While a watch is
active (``watch``: `prefixflow run` around the whole command, every ``ProgressDisplay`` around its shard
loop) a thread reports a call that has waited longer than ``PREFIXFLOW_STORAGE_SLOW_S`` seconds (default
``DEFAULT_SLOW_S``), again every ``REPEAT_S`` while it still waits, and once more when storage answers
again. Reports go to the innermost watch (the progress bar or log line when one is shown) and to the
``prefixflow.storage`` logger when logging is configured.
"""

from __future__ import annotations

import contextvars
import itertools
import logging
import math
import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from fsspec.asyn import sync_wrapper

SLOW_ENV = "PREFIXFLOW_STORAGE_SLOW_S"
DEFAULT_SLOW_S = 5.0
REPEAT_S = 15.0  # a call still waiting is reported again this often
POLL_S = 0.25
_log = logging.getLogger("prefixflow.storage")

Report = Callable[[str, bool], None]  # (text, still slow); slow=False: storage answers again


@dataclass
class Call:
    """One storage call in flight: what, where, since when, and how many HTTP attempts so far."""

    op: str
    path: str
    started: float
    attempts: int = 0


_calls: dict[int, Call] = {}
_ids = itertools.count()
_lock = threading.Lock()
_current: contextvars.ContextVar[Call | None] = contextvars.ContextVar(
    "prefixflow_storage_call", default=None
)


@contextmanager
def track(op: str, path: str) -> Iterator[Call]:
    """Register one call as in flight for its duration (thread- and task-safe)."""
    call = Call(op, path, time.monotonic())
    key = next(_ids)
    token = _current.set(call)
    with _lock:
        _calls[key] = call
    try:
        yield call
    finally:
        with _lock:
            _calls.pop(key, None)
        _current.reset(token)


def in_flight() -> list[Call]:
    with _lock:
        return list(_calls.values())


def _before_send(request: Any = None, **_: Any) -> None:
    """botocore's ``before-send`` event, once per HTTP attempt (retries included): count it, and drop
    ``Expect: 100-continue`` (botocore adds it to every PUT of a file-like body). aiohttp waits for the
    interim answer before sending the body with no timeout at all, so a PUT to a stalled endpoint hung
    for good while every other call timed out after ``read_timeout``; without the header the PUT's
    wait for the answer is bounded like any other. (The header only saves sending a body the store
    would refuse; our bodies are single parts and markers.)"""
    call = _current.get()
    if call is not None:
        call.attempts += 1
    headers = getattr(request, "headers", None)
    if headers is not None and "Expect" in headers:
        del headers["Expect"]


def instrument(fs: Any) -> None:
    """Track every request of an s3fs filesystem (idempotent; fsspec shares instances per process)."""
    if getattr(fs, "_prefixflow_tracked", False) or not hasattr(fs, "_call_s3"):
        return
    original = type(fs)._call_s3

    async def tracked(method: Any, *args: Any, **kwargs: Any) -> Any:
        name = method if isinstance(method, str) else getattr(method, "__name__", str(method))
        where = "/".join(
            str(p) for p in (kwargs.get("Bucket"), kwargs.get("Key") or kwargs.get("Prefix")) if p
        )
        with track(name, f"s3://{where}" if where else "s3"):
            await fs.set_session()
            client = getattr(fs, "_s3", None)
            if client is not None and not getattr(client, "_prefixflow_tracked", False):
                client.meta.events.register(
                    "before-send.s3", _before_send, unique_id="prefixflow-before-send"
                )
                client._prefixflow_tracked = True
            return await original(fs, method, *args, **kwargs)

    fs._call_s3 = tracked
    fs.call_s3 = sync_wrapper(tracked, obj=fs)
    fs._prefixflow_tracked = True


def slow_after_s() -> float:
    try:
        value = float(os.environ.get(SLOW_ENV, DEFAULT_SLOW_S))
    except ValueError:
        return DEFAULT_SLOW_S
    return value if value > 0 and math.isfinite(value) else DEFAULT_SLOW_S


def slow_text(call: Call, now: float) -> str:
    tries = f", attempt {call.attempts}" if call.attempts > 1 else ""
    waited = now - call.started
    return (
        f"storage slow: {call.op} {call.path} has not answered for {waited:.{0 if waited >= 10 else 1}f} s{tries}; "
        "retrying (if it stays away the command stops, and the same command resumes)"
    )


class _Watcher:
    """The one thread that reports slow calls to the innermost active watch."""

    def __init__(self) -> None:
        self.reports: list[Report] = []
        self.lock = threading.Lock()
        self.thread: threading.Thread | None = None
        self.wake = threading.Event()
        self.reported: dict[int, float] = {}  # id(call) -> when it was last reported
        self.slow_since: float | None = None
        self.checking = threading.Lock()  # the poll thread and a closing watch both check

    def push(self, report: Report) -> None:
        with self.lock:
            self.reports.append(report)
            if self.thread is None:
                self.wake.clear()
                self.thread = threading.Thread(target=self._run, name="prefixflow-storage-watch", daemon=True)
                self.thread.start()

    def pop(self, report: Report) -> None:
        self.check(time.monotonic())  # a recovery since the last poll still reaches this watch
        with self.lock:
            if report in self.reports:
                self.reports.remove(report)
            thread = self.thread if not self.reports else None
            if thread is not None:
                self.thread = None
                self.wake.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        while not self.wake.wait(POLL_S):
            self.check(time.monotonic())

    def check(self, now: float) -> None:
        """Report calls slower than the threshold (again every REPEAT_S), and the recovery."""
        with self.checking:
            self._check(now)

    def _check(self, now: float) -> None:
        threshold = slow_after_s()
        slow = [c for c in in_flight() if now - c.started >= threshold]
        live = {id(c) for c in slow}
        self.reported = {k: v for k, v in self.reported.items() if k in live}
        for call in slow:
            last = self.reported.get(id(call))
            if last is None or now - last >= REPEAT_S:
                self.reported[id(call)] = now
                self.slow_since = self.slow_since if self.slow_since is not None else call.started
                self._emit(slow_text(call, now), True)
        if not slow and self.slow_since is not None:
            waited, self.slow_since = now - self.slow_since, None
            self._emit(f"storage answering again (it was slow for {waited:.0f} s)", False)

    def _emit(self, text: str, slow: bool) -> None:
        if _log.hasHandlers():  # without handlers Python's last resort would print it twice
            (_log.warning if slow else _log.info)(text)
        with self.lock:
            report = self.reports[-1] if self.reports else None
        if report is not None:
            try:
                report(text, slow)
            except Exception:  # noqa: BLE001 - a broken display must not stop the watch
                pass


_watcher = _Watcher()


@contextmanager
def watch(report: Report) -> Iterator[None]:
    """Report slow storage calls to ``report`` while inside (the innermost watch wins)."""
    _watcher.push(report)
    try:
        yield
    finally:
        _watcher.pop(report)
