"""The lane supervisor's wait: finished futures come back, unfinished ones wait out the timeout, and
nothing arms prefect's interrupting timer (whose interrupt could leave a lock held at exit)."""

from __future__ import annotations

import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

from prefect.futures import PrefectConcurrentFuture

from prefixflow.flows import supervise
from prefixflow.flows.supervise import wait_for_any


def test_wait_for_any_returns_finished_futures_and_honours_the_timeout() -> None:
    release = threading.Event()
    with ThreadPoolExecutor(max_workers=2) as pool:
        quick = PrefectConcurrentFuture(uuid.uuid4(), pool.submit(lambda: "done"))
        slow = PrefectConcurrentFuture(uuid.uuid4(), pool.submit(release.wait, 30))
        quick.wrapped_future.result(timeout=10)
        assert wait_for_any([quick, slow], timeout_s=5.0) == [quick]
        started = time.monotonic()
        assert wait_for_any([slow], timeout_s=0.3) == []
        assert time.monotonic() - started >= 0.29
        release.set()
        assert wait_for_any([slow], timeout_s=10.0) == [slow]


def test_the_supervisor_does_not_use_prefects_timed_wait() -> None:
    """supervise.py polls on its own; prefect.futures.wait(timeout=...) must not come back in."""
    source = supervise.__loader__.get_source(supervise.__name__)  # type: ignore[union-attr]
    assert "from prefect.futures import PrefectFuture, wait" not in source
    assert not hasattr(supervise, "wait")
