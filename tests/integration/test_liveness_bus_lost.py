"""A bus connection closed for good by the server is never silent (issue #19, point 3), on a real nats-server.

A protocol line longer than nats-server's max_control_line (what the quota service sent for a 100,000-character
quota name) makes the server drop the connection, and nats-py then closes the client for good: it never reconnects.
The process used to carry on with every consumer logging ConnectionClosedError and /healthz 200. Now the
composition root's bus (koordbus.runtime.open_bus) stops the command with the reason (`Stop.wait` raises
SystemExit: a non-zero exit once shut down) and /healthz's bus check fails with it. While nats-py is only
reconnecting (the server away), /healthz fails once that has lasted past the bound, and passes again once the
server is back.
"""

from __future__ import annotations

from contextlib import AsyncExitStack
from pathlib import Path

import httpx
import pytest

from bus.cluster import free_port
from bus.server import EmbeddedNatsServer
from koordbus import runtime
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common.auth import TokenStore
from services.common.metrics import new_registry
from tests.support.waiting import eventually

BOUND_SECONDS = 0.5


async def test_a_connection_closed_by_the_server_stops_the_process_with_the_reason(nats_url: str) -> None:
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)  # its shutdown deadline is cancelled when the stack closes
        bus = await runtime.open_bus(stack, nats_url, name="doomed", ensure_streams=False)
        alive = runtime.bus_liveness(bus)
        assert alive() is None
        await bus.jetstream._nc.publish("x" * 5000, b"")  # past the bus's own check, as nats-py allows
        with pytest.raises(SystemExit, match=r"NATS connection to .* closed for good \(.*control line"):
            await stop.wait()  # not in a task: a task's SystemExit would leave the event loop
        reason = alive()
        assert reason is not None and "closed for good" in reason


async def test_closing_the_bus_ourselves_is_not_a_loss(nats_url: str) -> None:
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await runtime.open_bus(stack, nats_url, name="closed-by-us", ensure_streams=False)
    assert bus.link.lost_reason == "" and not stop.is_set()


async def test_healthz_fails_while_the_bus_is_down_past_the_bound_and_passes_once_it_is_back(tmp_path: Path) -> None:
    server = EmbeddedNatsServer(tmp_path / "nats", port=free_port())
    await server.start()
    try:
        async with AsyncExitStack() as stack:
            bus = await runtime.open_bus(stack, server.url, name="healthz")
            context = ApiContext(
                settings=ApiSettings(),
                registry=new_registry(),
                tokens=TokenStore(),
                liveness=(("bus", runtime.bus_liveness(bus, bound=BOUND_SECONDS)),),
            )
            transport = httpx.ASGITransport(app=create_app(context))
            async with httpx.AsyncClient(transport=transport, base_url="http://api") as http:
                assert (await http.get("/healthz")).json() == {"status": "ok"}
                await server.kill()

                async def failing() -> bool:
                    return (await http.get("/healthz")).status_code == 503

                await eventually(failing, timeout=10)
                body = (await http.get("/healthz")).json()
                assert body["failures"]["bus"].startswith("the NATS connection has been down for")
                await server.start()  # the same port: nats-py reconnects

                async def alive() -> bool:
                    return (await http.get("/healthz")).status_code == 200

                await eventually(alive, timeout=15)
    finally:
        await server.stop()


async def test_a_part_that_crashes_stops_the_process_with_the_reason() -> None:
    """A background part of a command (the agent in `koordbus up`, the simulation) that crashes used to be logged
    while the process carried on without it, /healthz 200."""

    async def crash() -> None:
        raise RuntimeError("the part broke")

    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        runtime.background(stack, crash(), name="simulation")
        with pytest.raises(SystemExit, match=r"simulation stopped with an error: RuntimeError: the part broke"):
            await stop.wait()
