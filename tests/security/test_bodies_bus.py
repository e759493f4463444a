"""Request/reply over a real nats-server with messages larger than its max payload (issue #19, bodies): the side
that cannot send hears why at once — PayloadTooLargeError for a request (the API answers 413), a RemoteError
naming the reply's size for an answer — instead of a 500 or a wait for the timeout."""

from __future__ import annotations

import time

import pytest

from bus.errors import PayloadTooLargeError, RemoteError
from bus.jetstream import JetStreamBus

TIMEOUT = 10.0


async def test_a_request_over_the_max_payload_is_refused_at_once(koordbus_bus: JetStreamBus) -> None:
    async def echo(data: bytes) -> bytes:
        return data

    responder = await koordbus_bus.serve("test.bodies.echo", echo, queue="q")
    try:
        with pytest.raises(PayloadTooLargeError, match="over the bus's max payload"):
            await koordbus_bus.request("test.bodies.echo", b"x" * (2 * 1024 * 1024), timeout=TIMEOUT)
    finally:
        await responder.stop()


async def test_a_reply_over_the_max_payload_is_an_error_reply_not_a_timeout(koordbus_bus: JetStreamBus) -> None:
    async def inflate(data: bytes) -> bytes:
        return data * (2 * 1024 * 1024)

    responder = await koordbus_bus.serve("test.bodies.inflate", inflate, queue="q")
    try:
        started = time.monotonic()
        with pytest.raises(RemoteError, match="PayloadTooLargeError: the reply of 2097152 bytes"):
            await koordbus_bus.request("test.bodies.inflate", b"x", timeout=TIMEOUT)
        assert time.monotonic() - started < TIMEOUT / 2
    finally:
        await responder.stop()
