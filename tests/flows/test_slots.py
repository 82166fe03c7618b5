"""Per-device concurrency limits against a real Prefect server: creation, choice, exclusivity."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from prefixflow.flows.devices import DeviceGroup, device_groups
from prefixflow.flows.slots import DeviceLimitUnavailable, ensure_limits, hold_devices, lane_devices

pytestmark = pytest.mark.timeout(120)
LOG = logging.getLogger("test-slots")
TWO_GPUS = device_groups(1, ["0", "1"])


def _limit(name: str) -> object | None:
    from prefect import get_client
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return client.read_global_concurrency_limit_by_name(name)
        except ObjectNotFound:
            return None


def test_missing_limits_are_created_once_even_when_racing(prefect_server: str):
    names = ["pf-race-gpu-0", "pf-race-gpu-1"]
    assert all(_limit(n) is None for n in names)
    with ThreadPoolExecutor(6) as pool:
        created = list(pool.map(lambda _: ensure_limits(names), range(6)))
    assert sorted(n for c in created for n in c) == names  # each created by exactly one caller
    for name in names:
        limit = _limit(name)
        assert limit is not None and limit.limit == 1 and limit.active and limit.active_slots == 0
    assert ensure_limits(names) == []


def test_lanes_spread_over_free_devices_then_wait(prefect_server: str):
    """Three holders, two devices, all starting at the same device: the first two get different
    devices without waiting, the third waits until one of them is released."""
    first = hold_devices("pf-spread", TWO_GPUS, 0, LOG)
    a = first.__enter__()
    with hold_devices("pf-spread", TWO_GPUS, 0, LOG) as b:
        assert {a, b} == set(TWO_GPUS)
        sleeps: list[float] = []

        def release_a_on_third_sleep(seconds: float) -> None:
            sleeps.append(seconds)
            if len(sleeps) == 3:
                first.__exit__(None, None, None)

        with hold_devices("pf-spread", TWO_GPUS, 0, LOG, sleep=release_a_on_third_sleep) as c:
            assert c == a and len(sleeps) == 3
            assert sleeps[1] > sleeps[0] and sleeps[2] > sleeps[1]  # backoff grows
            assert _limit("pf-spread-gpu-0").active_slots == _limit("pf-spread-gpu-1").active_slots == 1
    assert _limit("pf-spread-gpu-0").active_slots == _limit("pf-spread-gpu-1").active_slots == 0


def test_threads_never_share_a_device(prefect_server: str):
    """Six threads over two devices: per device, hold intervals never overlap."""
    intervals: dict[DeviceGroup, list[tuple[float, float]]] = {g: [] for g in TWO_GPUS}
    lock = threading.Lock()

    def work(i: int) -> None:
        with hold_devices("pf-share", TWO_GPUS, i, LOG) as group:
            start = time.monotonic()
            time.sleep(0.3)
            with lock:
                intervals[group].append((start, time.monotonic()))

    with ThreadPoolExecutor(6) as pool:
        list(pool.map(work, range(6)))
    assert sum(len(v) for v in intervals.values()) == 6
    for spans in intervals.values():
        spans.sort()
        assert all(end <= nxt for (_, end), (nxt, _) in zip(spans, spans[1:])), spans


def test_unreachable_api_fails_clearly(prefect_server: str):
    from prefect.settings import PREFECT_API_URL, PREFECT_CLIENT_MAX_RETRIES, temporary_settings

    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api", PREFECT_CLIENT_MAX_RETRIES: 0}):
        with pytest.raises(DeviceLimitUnavailable, match=r"127\.0\.0\.1:9.*concurrency_limit=None"):
            with hold_devices("pf-down", TWO_GPUS, 0, LOG):
                pytest.fail("ran without its device limit")


def test_opting_out_takes_no_limit_and_no_api(monkeypatch: pytest.MonkeyPatch):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5")
    with temporary_settings({PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with lane_devices(None, 1, 3, LOG) as (group, names):
            assert group.ordinals == (1,) and group.ids == ("5",) and names == []


def test_inactive_limit_is_an_error(prefect_server: str):
    from prefect import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        client.create_global_concurrency_limit(
            GlobalConcurrencyLimitCreate(name="pf-off-cpu", limit=1, active=False)
        )
    with pytest.raises(DeviceLimitUnavailable, match="inactive"):
        with hold_devices("pf-off", device_groups(0, []), 0, LOG):
            pytest.fail("ran without its device limit")
