"""A bus connection closed for good by the server is never silent (issue #19, point 3), on a real nats-server.

A protocol line longer than nats-server's max_control_line (what the quota service sent for a 100,000-character
quota name) makes the server drop the connection, and nats-py then closes the client for good: it never reconnects.
The process used to carry on with every consumer logging ConnectionClosedError and /healthz 200. Now the
composition root's bus (koordbus.runtime.open_bus) stops the command with the reason (`Stop.wait` raises
SystemExit: a non-zero exit once shut down) and /healthz's bus check fails with it.
"""

from __future__ import annotations

import asyncio
import signal
from contextlib import AsyncExitStack

import pytest

from koordbus import runtime


async def test_a_connection_closed_by_the_server_stops_the_process_with_the_reason(nats_url: str) -> None:
    loop = asyncio.get_running_loop()
    try:
        async with AsyncExitStack() as stack:
            stop = runtime.stop_event_on_signals()
            bus = await runtime.open_bus(stack, nats_url, name="doomed", ensure_streams=False)
            alive = runtime.bus_liveness(bus)
            assert alive() is None
            await bus.jetstream._nc.publish("x" * 5000, b"")  # past the bus's own check, as nats-py allows
            with pytest.raises(SystemExit, match=r"NATS connection to .* closed for good \(.*control line"):
                await stop.wait()  # not in a task: a task's SystemExit would leave the event loop
            reason = alive()
            assert reason is not None and "closed for good" in reason
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)


async def test_closing_the_bus_ourselves_is_not_a_loss(nats_url: str) -> None:
    loop = asyncio.get_running_loop()
    try:
        async with AsyncExitStack() as stack:
            stop = runtime.stop_event_on_signals()
            bus = await runtime.open_bus(stack, nats_url, name="closed-by-us", ensure_streams=False)
        assert bus.link.lost_reason == "" and not stop.is_set()
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
