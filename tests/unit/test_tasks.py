"""services.common.tasks.cancel_and_wait: a task that swallows a cancellation is cancelled again; one that never
stops is left behind after the timeout, with an error, and the caller goes on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from services.common.tasks import cancel_and_wait


async def test_a_swallowed_cancellation_is_repeated() -> None:
    swallowed = 0

    async def stubborn() -> None:
        nonlocal swallowed
        while True:
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                swallowed += 1
                if swallowed == 2:
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await cancel_and_wait(task, timeout=5)
    assert task.cancelled() and swallowed == 2


async def test_a_task_that_never_stops_is_left_behind(caplog: pytest.LogCaptureFixture) -> None:
    release = asyncio.Event()

    async def deaf() -> None:
        while not release.is_set():
            try:
                await asyncio.sleep(10)
            except asyncio.CancelledError:
                continue

    task = asyncio.create_task(deaf(), name="deaf")
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="services.common.tasks"):
        await cancel_and_wait(task, timeout=0.3)
    assert not task.done() and "task deaf did not stop" in caplog.text
    release.set()
    task.cancel()
    await asyncio.wait({task}, timeout=1)
    assert task.done()
    await cancel_and_wait(None)
