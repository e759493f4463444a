"""Stopping a background task without ever hanging the caller.

`cancel_and_wait(task)` cancels and waits for it, cancelling again if the task swallowed the cancellation (on Python
3.11 `asyncio.wait_for` can lose one that races its inner future) and giving up with an error log after `timeout`:
a service's stop — and a test's teardown — must end.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

RECANCEL_SECONDS = 0.5


async def cancel_and_wait(task: asyncio.Task[Any] | None, *, timeout: float = 10.0) -> None:
    if task is None or task.done():
        return
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not task.done():
        task.cancel()
        remaining = deadline - loop.time()
        if remaining <= 0:
            log.error("task %s did not stop within %.0f s of its cancellation; left behind", task.get_name(), timeout)
            return
        await asyncio.wait({task}, timeout=min(RECANCEL_SECONDS, remaining))
    if not task.cancelled() and task.exception() is not None:
        log.warning("task %s ended with %r while stopping", task.get_name(), task.exception())
