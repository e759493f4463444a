"""Waiting in tests for something asynchronous to become true."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable


async def eventually(
    check: Callable[[], Awaitable[bool] | bool], *, timeout: float = 10.0, state: Callable[[], str] | None = None
) -> None:
    """Poll `check` (sync or async) every 20 ms until it is truthy; AssertionError after `timeout` seconds, saying
    what `state()` says then (what a rare failure needs to be explained)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        result = check()
        if isinstance(result, Awaitable):
            result = await result
        if result:
            return
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time" + (f": {state()}" if state is not None else ""))
        await asyncio.sleep(0.02)
