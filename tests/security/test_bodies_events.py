"""Hostile query input to the event and actuation routes (issue #19, bodies): a `since` no datetime can hold is a 400
before anything is streamed, and a WebSocket refusal whose reason is long and multibyte still closes with a proper
close frame. A real uvicorn server in front of a real nats-server, as tests/integration/test_event_stream.py runs it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
import websockets

from bus.jetstream import JetStreamBus
from services.common import auth
from tests.support import api_auth, live_api

BAD_SINCE = ["inf", "-inf", "nan", "1e12", "-1", "1e400", "9999-12-31T23:59:59-14:00"]


@pytest_asyncio.fixture
async def base(koordbus_bus: JetStreamBus) -> AsyncIterator[str]:
    async with contextlib.AsyncExitStack() as stack:
        yield await live_api.serve_events_api(stack, koordbus_bus)


@pytest_asyncio.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers=api_auth.headers(auth.VIEWER), timeout=httpx.Timeout(30)) as c:
        yield c


@pytest.mark.parametrize("since", BAD_SINCE)
@pytest.mark.parametrize("path", ["/api/v1/events", "/api/v1/events/stream", "/api/v1/nodes/n1/actuations"])
async def test_a_since_out_of_range_is_a_400_before_any_stream(
    base: str, client: httpx.AsyncClient, path: str, since: str
) -> None:
    async with client.stream("GET", f"{base}{path}", params={"since": since}) as response:
        body = await asyncio.wait_for(response.aread(), 10)
    assert response.status_code == 400, body
    assert f"invalid since {since!r}" in json.loads(body)["error"]


async def test_a_since_in_range_still_works_on_actuations(base: str, client: httpx.AsyncClient) -> None:
    for since in ("0", "1700000000.5", "2026-11-24T03:00:00Z"):
        response = await client.get(f"{base}/api/v1/nodes/n1/actuations", params={"since": since})
        assert response.status_code == 200, response.text


async def test_a_websocket_refusal_with_a_long_multibyte_reason_closes_cleanly(base: str) -> None:
    name = "ü" * 100  # 200 bytes of UTF-8 in the refusal's reason
    url = base.replace("http", "ws") + f"/api/v1/events/ws?{name}=1"
    async with websockets.connect(url, additional_headers=api_auth.headers(auth.VIEWER)) as refused:
        frame = json.loads(await asyncio.wait_for(refused.recv(), 10))
        assert frame["status"] == 400 and name in frame["error"]  # the whole message is in the error frame
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(refused.recv(), 10)
    received = closed.value.rcvd
    assert received is not None and received.code == 4400
    assert received.reason.startswith("unknown query parameter(s) 'üü") and received.reason.endswith("…")
    assert len(received.reason.encode()) <= 123
