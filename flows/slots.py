"""Hold slots of a Prefect global concurrency limit while a lane owns its device(s)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager

from prefect.concurrency.sync import concurrency

DEFAULT_LIMIT = "prefixflow-gpu"


@contextmanager
def device_slots(
    limit: str | None, occupy: int, logger: logging.Logger | logging.LoggerAdapter
) -> Iterator[bool]:
    """Acquire `occupy` slots of the global concurrency limit `limit` for the duration of the block.

    Yields True when slots are held. Degrades to running without a limit (yields False, logs a
    warning) when `limit` is None, the limit does not exist on the server, or acquisition fails
    for any reason other than the block itself. Waits as long as it takes for free slots.
    """
    with ExitStack() as stack:
        held = False
        if limit and occupy > 0:
            try:
                stack.enter_context(
                    concurrency(limit, occupy=occupy, strict=True, raise_on_lease_renewal_failure=False)
                )
                held = True
            except Exception as exc:  # noqa: BLE001 - any failure to acquire means "run unlimited"
                logger.warning(
                    "concurrency limit %r not applied (%s: %s); running without it. "
                    "Create it with: prefect gcl create %s --limit <number of GPUs>",
                    limit,
                    type(exc).__name__,
                    exc,
                    limit,
                )
        yield held
