"""Per-device Prefect global concurrency limits: a thread lane owns its device(s) exclusively.

Every local device has its own limit of one slot (`<prefix>-gpu-<id>`, `<prefix>-cpu`, see
`flows.devices`), created on first use. A lane tries the device groups one after another without
waiting on any of them, cycling with backoff until one is free, and keeps the slot (a Prefect
lease, renewed in the background) until its last shard is done. Two lanes, of one flow or of two
flows on the same Prefect server, therefore never hold the same device at once.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager

import httpx
from prefect import get_client
from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
from prefect.concurrency.asyncio import ConcurrencySlotAcquisitionError
from prefect.concurrency.sync import concurrency
from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

from prefixflow.flows.devices import DeviceGroup, device_groups, gpu_ids

DEFAULT_LIMIT = "prefixflow"  # prefix of the per-device limits: prefixflow-gpu-0, prefixflow-cpu
LEASE_S = 60.0  # a crashed lane's device frees itself this long after its last lease renewal
FIRST_DELAY_S, MAX_DELAY_S = 0.2, 5.0  # backoff between rounds over busy devices

Logger = logging.Logger | logging.LoggerAdapter


class DeviceLimitUnavailable(RuntimeError):
    """The device limits cannot be created or taken (Prefect API unreachable, limit inactive)."""


def ensure_limits(names: Sequence[str]) -> list[str]:
    """Create each missing limit with one slot; return the names this call created.

    Idempotent, and safe when several lanes or flows race to create the same limit (the loser's
    409 means it exists). An existing limit is left as it is, but an inactive one is an error:
    Prefect would hand out no slots for it, so it would protect nothing.
    """
    created: list[str] = []
    try:
        with get_client(sync_client=True) as client:
            for name in names:
                try:
                    existing = client.read_global_concurrency_limit_by_name(name)
                except ObjectNotFound:
                    try:
                        client.create_global_concurrency_limit(
                            GlobalConcurrencyLimitCreate(name=name, limit=1)
                        )
                        created.append(name)
                    except ObjectAlreadyExists:
                        pass  # another lane or flow created it first
                    continue
                if not existing.active:
                    raise DeviceLimitUnavailable(
                        f"device limit {name!r} is inactive, so it would not keep two lanes off this "
                        f"device; enable it (prefect gcl enable {name}) or delete it to have it recreated"
                    )
    except DeviceLimitUnavailable:
        raise
    except Exception as exc:  # noqa: BLE001 - anything here means the limits cannot be used
        raise DeviceLimitUnavailable(_unreachable(names, exc)) from exc
    return created


@contextmanager
def hold_devices(
    prefix: str,
    groups: Sequence[DeviceGroup],
    first: int,
    logger: Logger,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[DeviceGroup]:
    """Hold the limit(s) of one free device group for the duration of the block; yield the group.

    Tries the groups in order starting at `first % len(groups)` (so the lanes of one flow start
    on different devices), never waiting on a busy one; when all are busy, sleeps with jittered
    exponential backoff and tries again, as long as it takes (a lane timeout still applies).
    Raises `DeviceLimitUnavailable` when the limits cannot be created or taken.
    """
    if not groups:
        raise ValueError("no device groups to choose from")
    ensure_limits(sorted({name for g in groups for name in g.limit_names(prefix)}))
    start = first % len(groups)
    order = [*groups[start:], *groups[:start]]
    with ExitStack() as stack:
        delay, waiting_since = FIRST_DELAY_S, 0.0
        while True:
            group = next((g for g in order if _try_hold(stack, g.limit_names(prefix))), None)
            if group is not None:
                break
            if not waiting_since:
                waiting_since = time.monotonic()
                logger.info("all %d device(s) busy (%s); waiting for one", len(order), _names(prefix, order))
            sleep(delay * random.uniform(0.75, 1.25))
            delay = min(2 * delay, MAX_DELAY_S)
        if waiting_since:
            logger.info("got %s after waiting %.1fs", group.describe(), time.monotonic() - waiting_since)
        yield group


def _try_hold(stack: ExitStack, names: list[str]) -> bool:
    """Take one slot of every limit in `names` (all or none) without waiting; False if busy."""
    try:
        stack.enter_context(
            concurrency(
                names,
                occupy=1,
                max_retries=0,  # a busy device answers 423 at once instead of queueing
                lease_duration=LEASE_S,
                strict=True,
                raise_on_lease_renewal_failure=True,  # a lost lease stops the lane, never shares
            )
        )
    except ConcurrencySlotAcquisitionError as exc:
        cause = exc.__cause__
        if isinstance(cause, httpx.HTTPStatusError) and cause.response.status_code == 423:
            return False
        if cause is None:  # strict: the limit vanished (deleted while we ran): recreate, retry
            ensure_limits(names)
            return False
        raise DeviceLimitUnavailable(_unreachable(names, cause)) from exc
    return True


def _unreachable(names: Sequence[str], exc: BaseException) -> str:
    from prefect.settings import PREFECT_API_URL

    return (
        f"cannot use the device concurrency limit(s) {', '.join(names)} on the Prefect API at "
        f"{PREFECT_API_URL.value() or '(ephemeral)'}: {type(exc).__name__}: {exc}. Lanes do not run "
        "without them, so that two flows never share a device; start or reach the Prefect server, "
        "or pass concurrency_limit=None (--concurrency-limit none) to run without device limits"
    )


def _names(prefix: str, groups: Sequence[DeviceGroup]) -> str:
    return ", ".join("+".join(g.limit_names(prefix)) for g in groups)


@contextmanager
def lane_devices(
    limit: str | None, gpus_per_lane: int, lane: int, logger: Logger
) -> Iterator[tuple[DeviceGroup, list[str]]]:
    """The device group a local (thread) lane runs on, and the limit names it holds meanwhile.

    With a `limit` prefix the lane waits for a free group through `hold_devices`; with None
    (the documented opt-out) it takes group `lane % groups` unguarded, as a lone flow may.
    """
    groups = device_groups(gpus_per_lane, gpu_ids())
    if limit is None:
        group = groups[lane % len(groups)]
        logger.warning(
            "lane %d: no device limits (concurrency_limit=None); using %s unguarded", lane, group.describe()
        )
        yield group, []
        return
    with hold_devices(limit, groups, lane, logger) as group:
        names = group.limit_names(limit)
        logger.info("lane %d: holds %s (%s)", lane, group.describe(), ", ".join(names))
        yield group, names
