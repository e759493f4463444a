"""Issue #19, names at the API, against a real nats-server and a real uvicorn server: a name that is not a
Kubernetes name is refused with a 4xx naming the parameter before it becomes a subject. Before, a 5,000-character
node, quota or tree filter (history, SSE, WebSocket) or node path became a subject longer than nats-server's
4096-byte control line: the server dropped the connection, the request was a 500 and every later bus read of the
process failed with `nats: connection closed`."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from urllib.parse import urlencode

import httpx
import pytest
import pytest_asyncio
import websockets

from bus import subjects
from bus.jetstream import JetStreamBus
from services.common import auth
from tests.support import api_auth, live_api

LONG = "x" * 5000


@dataclass
class Api:
    base: str
    bus: JetStreamBus
    client: httpx.AsyncClient


@pytest_asyncio.fixture
async def api(koordbus_bus: JetStreamBus) -> AsyncIterator[Api]:
    bus = koordbus_bus
    async with contextlib.AsyncExitStack() as stack:
        base = await live_api.serve_events_api(stack, bus)
        headers = api_auth.headers(auth.VIEWER)
        client = await stack.enter_async_context(httpx.AsyncClient(headers=headers, timeout=httpx.Timeout(20)))
        yield Api(base=f"{base}/api/v1", bus=bus, client=client)


async def decided(bus: JetStreamBus, node: str) -> None:
    body = {"node": node, "batch": {"cpu": 1000}}
    await bus.publish(subjects.noderesource_computed(node), json.dumps(body).encode(), msg_id=f"nr-{node}")


async def assert_bus_still_serves(api: Api) -> None:
    """The process's bus connection survived: a read through the API and a publish both work."""
    await decided(api.bus, "n1")
    page = await api.client.get(f"{api.base}/events", params={"node": "n1", "since": "0"})
    assert page.status_code == 200, page.text
    assert [e["node"] for e in page.json()["events"]] == ["n1"]
    actuations = await api.client.get(f"{api.base}/nodes/n1/actuations")
    assert actuations.status_code == 200, actuations.text


@pytest.mark.parametrize(
    ("key", "value"),
    [("node", LONG), ("quota", LONG), ("tree", LONG), ("namespace", "x" * 64), ("node", "a/b"), ("node", "n1\n")],
)
async def test_a_filter_that_is_not_a_kubernetes_name_is_a_400_and_the_bus_lives_on(
    api: Api, key: str, value: str
) -> None:
    history = await api.client.get(f"{api.base}/events", params={key: value})
    assert history.status_code == 400, history.text
    error = history.json()["error"]
    assert error.startswith(f"invalid {key} ") and len(error) < 400
    async with api.client.stream("GET", f"{api.base}/events/stream", params={key: value}) as stream:
        assert stream.status_code == 400
        assert json.loads(await stream.aread())["error"].startswith(f"invalid {key} ")
    socket_url = api.base.replace("http", "ws") + "/events/ws?" + urlencode({key: value})
    async with websockets.connect(socket_url, additional_headers=api_auth.headers(auth.VIEWER)) as refused:
        frame = json.loads(await asyncio.wait_for(refused.recv(), 10))
        assert frame["status"] == 400 and frame["error"].startswith(f"invalid {key} ")
    await assert_bus_still_serves(api)


@pytest.mark.parametrize("node", ["x" * 4000, "x" * 254, "Node_1", "a..b", "n\u00e9"])
async def test_a_node_path_that_is_not_a_node_name_is_a_422_naming_it(api: Api, node: str) -> None:
    for path in (f"nodes/{node}/actuations", f"nodes/{node}/slo"):
        answer = await api.client.get(f"{api.base}/{path}")
        assert answer.status_code == 422, (path, answer.text)
        assert answer.json()["error"].startswith("invalid node ")
    await assert_bus_still_serves(api)
