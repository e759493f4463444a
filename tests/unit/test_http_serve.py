"""koordbus.http_serve.reserve: a port held from its check to the server's start, on which the server then serves
(`koordbus up` checks its ports first and serves them only after starting its nats-server and services; a port
released in between was taken once by another socket, and uvicorn ended `up` with exit code 3)."""

from __future__ import annotations

import asyncio
import contextlib
import socket

import pytest
from fastapi import FastAPI

from koordbus import http_serve


def ping_app() -> FastAPI:
    app = FastAPI()

    @app.get("/ping")
    async def ping() -> dict[str, str]:
        return {"pong": "yes"}

    return app


async def get(port: int, path: str) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        return await reader.read()
    finally:
        writer.close()


def test_a_reserved_port_cannot_be_taken_and_a_held_one_is_refused() -> None:
    held = http_serve.reserve("127.0.0.1", 0)
    assert held is not None
    with held:
        port = held.getsockname()[1]
        with socket.socket() as other, pytest.raises(OSError):  # as uvicorn would bind it
            other.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            other.bind(("127.0.0.1", port))
            other.listen()
        assert http_serve.reserve("127.0.0.1", port) is None
    again = http_serve.reserve("127.0.0.1", port)  # free once closed
    assert again is not None
    again.close()


async def test_the_server_serves_on_the_reserved_socket_and_a_caller_waiting_meanwhile_is_answered() -> None:
    held = http_serve.reserve("127.0.0.1", 0)
    assert held is not None
    port = held.getsockname()[1]
    early = asyncio.create_task(get(port, "/ping"))  # connects before the server runs: waits in the backlog
    await asyncio.sleep(0.2)
    assert not early.done()
    async with contextlib.AsyncExitStack() as stack:
        await http_serve.serve_http(stack, ping_app(), host="127.0.0.1", port=port, reserved=held)
        answer = await asyncio.wait_for(early, timeout=10)
        assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b'{"pong":"yes"}')
    with pytest.raises(OSError):  # stopped: the socket is closed with the server
        await get(port, "/ping")
