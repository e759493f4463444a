"""The event stream API end to end: events published on a real nats-server reach SSE and WebSocket subscribers of a
real uvicorn server, filtered by type and key; a subscriber resumes from its last event id or a time with nothing
missed or repeated; history pages through the same events; bad input is a 400 naming the problem; caps answer 503;
a client that goes away costs nothing."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
import websockets

from bus import streams, subjects
from bus.cluster import free_port
from bus.errors import BusUnavailableError
from bus.jetstream import JetStreamBus
from bus.memory import MemoryBus
from koordbus import cli, http_serve
from koordbus.events import SseMessage, parse_sse
from services.api import event_catalogue as catalogue
from services.api import event_hub as event_hub_module
from services.api.app import ApiContext, create_app
from services.api.event_hub import EventHub
from services.api.settings import ApiSettings
from services.common import auth
from services.common.metrics import new_registry
from tests.support import api_auth
from tests.support.waiting import eventually


@dataclass
class Api:
    base: str
    hub: EventHub
    bus: JetStreamBus


@pytest_asyncio.fixture
async def api(koordbus_bus: JetStreamBus) -> AsyncIterator[Api]:
    bus = koordbus_bus
    await bus.ensure_streams(streams.all_streams())
    hub = EventHub(bus, max_subscriptions=4, max_per_caller=3, queue_size=50)
    context = ApiContext(settings=ApiSettings(), registry=new_registry(), tokens=api_auth.token_store(), event_hub=hub)
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(hub.close)
        port = free_port()
        await http_serve.serve_http(stack, create_app(context), host="127.0.0.1", port=port)
        yield Api(base=f"http://127.0.0.1:{port}", hub=hub, bus=bus)


async def decided(bus: JetStreamBus, node: str, n: int) -> None:
    body = {"node": node, "n": n, "batch": {"cpu": 1000 * n}}
    await bus.publish(subjects.noderesource_computed(node), json.dumps(body).encode(), msg_id=f"nr-{node}-{n}")


async def quota_status(bus: JetStreamBus, quota: str, tree: str, runtime_cpu: int) -> None:
    body = {
        "type": "quota.status.v1",
        "quota": quota,
        "tree": tree,
        "computed_at": 1.0,
        "events_seq": 1,
        "r": runtime_cpu,
    }
    await bus.publish(subjects.quota_status(quota), json.dumps(body).encode(), msg_id=f"qs-{quota}-{runtime_cpu}")


class Subscriber:
    """One SSE subscription read in the background."""

    def __init__(self, client: httpx.AsyncClient, url: str, headers: dict[str, str] | None = None) -> None:
        self.messages: list[SseMessage] = []
        self.status = 0
        self._opened = asyncio.Event()
        self._task = asyncio.create_task(self._read(client, url, headers or {}))

    async def _read(self, client: httpx.AsyncClient, url: str, headers: dict[str, str]) -> None:
        async with client.stream("GET", url, headers=headers) as response:
            self.status = response.status_code
            self._opened.set()
            if response.status_code != 200:
                return
            async for message in parse_sse(response.aiter_lines()):
                self.messages.append(message)

    async def opened(self) -> None:
        await asyncio.wait_for(self._opened.wait(), 10)

    @property
    def events(self) -> list[dict[str, Any]]:
        return [json.loads(m.data) for m in self.messages if m.event not in ("warning", "dropped", "shutdown")]

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
            await self._task


@pytest_asyncio.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(headers=api_auth.headers(auth.VIEWER), timeout=httpx.Timeout(30, read=60)) as c:
        yield c


async def test_subscribers_get_live_events_of_their_types_and_keys_only(api: Api, client: httpx.AsyncClient) -> None:
    n1 = Subscriber(client, f"{api.base}/api/v1/events/stream?type=noderesource.computed&node=n1")
    quotas = Subscriber(client, f"{api.base}/api/v1/events/stream?type=quota.status,noderesource.computed&tree=t1")
    # a tree filter narrows to the types that carry a tree: quota.status only
    everything = Subscriber(client, f"{api.base}/api/v1/events/stream")
    for s in (n1, quotas, everything):
        await s.opened()
    await eventually(lambda: api.hub.subscriptions == 3)
    await decided(api.bus, "n1", 1)
    await decided(api.bus, "n2", 1)
    await quota_status(api.bus, "q1", "t1", 5)
    await quota_status(api.bus, "q9", "t9", 5)
    await decided(api.bus, "n1", 2)
    await eventually(lambda: len(n1.events) == 2 and len(quotas.events) == 1 and len(everything.events) == 5)
    assert [(e["type"], e["node"], e["data"]["n"]) for e in n1.events] == [
        ("noderesource.computed", "n1", 1),
        ("noderesource.computed", "n1", 2),
    ]
    first = n1.events[0]
    assert first["stream"] == streams.KOORD_NODERESOURCE and first["seq"] == 1 and first["time"] > 1.7e9
    assert (first["quota"], first["tree"], first["namespace"], first["workload"]) == (None, None, None, None)
    assert [m.event for m in n1.messages] == ["noderesource.computed"] * 2
    assert n1.messages[0].id == first["id"] and first["id"].startswith("1-")
    assert [(e["type"], e["quota"], e["tree"]) for e in quotas.events] == [("quota.status", "q1", "t1")]
    # order holds within a stream (the tails of different streams interleave as they read)
    by_stream = [(e["stream"], e["seq"]) for e in everything.events]
    assert [seq for stream, seq in by_stream if stream == streams.KOORD_NODERESOURCE] == [1, 2, 3]
    assert [seq for stream, seq in by_stream if stream == streams.KOORD_QUOTA_STATUS] == [1, 2]
    for s in (n1, quotas, everything):
        await s.close()
    # a client that went away costs nothing: its subscription is gone
    await eventually(lambda: api.hub.subscriptions == 0)


async def test_resume_from_the_last_id_or_a_time_misses_nothing_and_repeats_nothing(
    api: Api, client: httpx.AsyncClient
) -> None:
    url = f"{api.base}/api/v1/events/stream?type=noderesource.computed,quota.status"
    first = Subscriber(client, url)
    await first.opened()
    await eventually(lambda: api.hub.subscriptions == 1)
    await decided(api.bus, "n1", 1)
    await quota_status(api.bus, "q1", "t1", 1)
    await eventually(lambda: len(first.events) == 2)
    last_id = first.messages[-1].id
    await first.close()
    # while nobody listens
    await decided(api.bus, "n1", 2)
    await quota_status(api.bus, "q1", "t1", 2)
    await decided(api.bus, "n2", 3)
    again = Subscriber(client, url, headers={"Last-Event-ID": last_id})
    await again.opened()
    await eventually(lambda: len(again.events) == 3)
    await decided(api.bus, "n1", 4)  # and live after the catch-up
    await eventually(lambda: len(again.events) == 4)
    await asyncio.sleep(0.3)
    got = [(e["type"], e["data"].get("n", e["data"].get("r"))) for e in again.events]
    assert sorted(got) == sorted(
        [("noderesource.computed", 2), ("quota.status", 2), ("noderesource.computed", 3), ("noderesource.computed", 4)]
    )
    assert got[-1] == ("noderesource.computed", 4)
    await again.close()
    # by time: everything stored at or after the earliest event's time (the two streams' tails are independent
    # readers, so the first event received may be either stream's)
    since = min(e["time"] for e in first.events)
    by_time = Subscriber(client, f"{url}&since={since}")
    await by_time.opened()
    await eventually(lambda: len(by_time.events) == 5)
    # KOORD_QUOTA_STATUS keeps the last status per quota: q1's first one is gone, its second is there
    assert sorted((e["stream"], e["seq"]) for e in by_time.events) == [
        (streams.KOORD_NODERESOURCE, 1), (streams.KOORD_NODERESOURCE, 2), (streams.KOORD_NODERESOURCE, 3),
        (streams.KOORD_NODERESOURCE, 4), (streams.KOORD_QUOTA_STATUS, 2),
    ]  # fmt: skip
    await by_time.close()


async def test_a_cursor_older_than_the_stream_keeps_resumes_at_the_oldest_with_a_warning(
    api: Api, client: httpx.AsyncClient
) -> None:
    for version in range(3):  # KOORD_CLUSTER keeps one message per subject: sequences 1 and 2 are gone
        await api.bus.publish(
            subjects.cluster_node("n1"),
            msgspec.json.encode({"name": "n1", "observed_at": float(version)}),
            msg_id=f"node-{version}",
        )
    sub = Subscriber(client, f"{api.base}/api/v1/events/stream?type=node.lifecycle&cursor=1-c0")
    await sub.opened()
    await eventually(lambda: len(sub.messages) == 2)
    warning = sub.messages[0]
    assert warning.event == "warning"
    assert "KOORD_CLUSTER no longer holds sequences 1..2" in json.loads(warning.data)["message"]
    assert [(e["type"], e["node"], e["seq"]) for e in sub.events] == [("node.lifecycle", "n1", 3)]
    await sub.close()


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("type=nodemetric.computd", "unknown event type(s) 'nodemetric.computd'"),
        ("type=nodemetric.computed&quota=q1", "no requested event type can be filtered by quota=q1"),
        ("cursor=banana", "malformed cursor 'banana'"),
        ("cursor=1-x12", "'x12' is not <stream code><sequence>"),
        ("since=yesterday", "invalid since 'yesterday'"),
        ("since=2026-01-01T00:00:00", "give a time zone"),
        ("cursor=1-m1&since=5", "not both"),
    ],
)
async def test_bad_input_is_a_400_naming_the_problem(
    api: Api, client: httpx.AsyncClient, query: str, message: str
) -> None:
    for path in ("/api/v1/events/stream", "/api/v1/events"):
        answer = await client.get(f"{api.base}{path}?{query}")
        assert answer.status_code == 400, answer.text
        assert message in answer.json()["error"]
    assert api.hub.subscriptions == 0


async def test_roles_and_caps(api: Api, client: httpx.AsyncClient) -> None:
    anonymous = await client.get(f"{api.base}/api/v1/events/stream", headers={"Authorization": ""})
    assert anonymous.status_code == 401
    url = f"{api.base}/api/v1/events/stream?type=quota.status"
    mine = [Subscriber(client, url) for _ in range(3)]
    for s in mine:
        await s.opened()
    fourth = await client.get(url)
    assert fourth.status_code == 503 and "test-viewer already has 3 event subscriptions" in fourth.json()["error"]
    other = Subscriber(client, url, headers=api_auth.headers(auth.ADMIN))
    await other.opened()
    assert other.status == 200
    full = await client.get(url, headers=api_auth.headers(auth.QUOTA_ADMIN))
    assert full.status_code == 503 and "at most 4 event subscriptions" in full.json()["error"]
    for s in (*mine, other):
        await s.close()
    await eventually(lambda: api.hub.subscriptions == 0)
    metrics = (await client.get(f"{api.base}/metrics")).text
    assert "koordbus_api_event_subscriptions 0.0" in metrics


async def test_history_pages_through_every_matching_event_once(api: Api, client: httpx.AsyncClient) -> None:
    for n in range(5):
        await decided(api.bus, "n1", n)
        await quota_status(api.bus, f"q{n}", "t1", n)  # one per quota: the stream keeps each quota's last
    await decided(api.bus, "n2", 99)
    seen: list[tuple[str, int]] = []
    cursor = None
    pages = 0
    while True:
        params: dict[str, Any] = {"type": "noderesource.computed,quota.status", "limit": 3, "since": 0}
        if cursor:
            params = {"type": "noderesource.computed,quota.status", "limit": 3, "cursor": cursor}
        page = (await client.get(f"{api.base}/api/v1/events", params=params)).json()
        pages += 1
        seen += [(e["stream"], e["seq"]) for e in page["events"]]
        cursor = page["next"]
        if cursor is None:
            break
        assert pages < 10
    assert sorted(seen) == sorted(set(seen)) and len(seen) == 11
    node_only = (await client.get(f"{api.base}/api/v1/events", params={"node": "n2", "since": 0})).json()
    assert [(e["type"], e["data"]["n"]) for e in node_only["events"]] == [("noderesource.computed", 99)]
    assert node_only["next"] is None and node_only["warnings"] == []


async def test_websocket_subscribers(api: Api) -> None:
    url = api.base.replace("http", "ws") + "/api/v1/events/ws?type=noderesource.computed&node=n1"
    async with websockets.connect(url, additional_headers=api_auth.headers(auth.VIEWER)) as ws:
        await eventually(lambda: api.hub.subscriptions == 1)
        await decided(api.bus, "n2", 1)
        await decided(api.bus, "n1", 2)
        event = json.loads(await asyncio.wait_for(ws.recv(), 10))
        assert (event["type"], event["node"], event["data"]["n"]) == ("noderesource.computed", "n1", 2)
    await eventually(lambda: api.hub.subscriptions == 0)
    async with websockets.connect(url) as refused:  # no token
        frame = json.loads(await asyncio.wait_for(refused.recv(), 10))
        assert frame["type"] == "error" and frame["status"] == 401 and "missing bearer token" in frame["error"]
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await refused.recv()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4401


async def test_a_stopping_server_ends_every_stream_first(
    koordbus_bus: JetStreamBus, client: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    """When the server stops, each open SSE stream gets `event: shutdown` and ends, a WebSocket gets the same and
    close code 1001, before the HTTP server waits for open responses: uvicorn has nothing to cancel (without the
    ending, it waits out its graceful-shutdown timeout and logs an ERROR for every stream still open)."""
    bus = koordbus_bus
    await bus.ensure_streams(streams.all_streams())
    hub = EventHub(bus)
    context = ApiContext(settings=ApiSettings(), registry=new_registry(), tokens=api_auth.token_store(), event_hub=hub)
    stack = contextlib.AsyncExitStack()
    async with stack:
        stack.push_async_callback(hub.close)
        port = free_port()
        await http_serve.serve_http(
            stack, create_app(context), host="127.0.0.1", port=port, end_streams=hub.end_streams
        )
        base = f"http://127.0.0.1:{port}"
        sse = Subscriber(client, f"{base}/api/v1/events/stream?type=noderesource.computed")
        await sse.opened()
        ws = await websockets.connect(
            base.replace("http", "ws") + "/api/v1/events/ws", additional_headers=api_auth.headers(auth.VIEWER)
        )
        await eventually(lambda: hub.subscriptions == 2)
        await decided(bus, "n1", 1)
        await eventually(lambda: len(sse.events) == 1)
        assert json.loads(await asyncio.wait_for(ws.recv(), 10))["data"]["n"] == 1
    # the stack is closed: the server has stopped
    assert [m.event for m in sse.messages][-1] == "shutdown"
    assert "stopping" in json.loads(sse.messages[-1].data)["reason"]
    last = json.loads(await asyncio.wait_for(ws.recv(), 10))
    assert last["type"] == "shutdown" and "stopping" in last["reason"]
    with pytest.raises(websockets.ConnectionClosed) as closed:
        await ws.recv()
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1001
    assert not [r for r in caplog.records if "graceful shutdown exceeded" in r.getMessage()]
    await sse.close()
    with pytest.raises(event_hub_module.CapacityError, match="stopping"):
        await hub.subscribe(catalogue.parse_filter(["noderesource.computed"], {}), caller="late")


async def test_koordbus_events_tail_list_and_types(api: Api, capsys: pytest.CaptureFixture[str]) -> None:
    def koordbus(*args: str) -> tuple[int, str, str]:
        code = cli.main(["events", "--api", api.base, "--token", api_auth.TOKENS[auth.VIEWER], *args])
        out, err = capsys.readouterr()
        return code, out, err

    await decided(api.bus, "n1", 1)
    tail = asyncio.create_task(
        asyncio.to_thread(koordbus, "tail", "--type", "noderesource.computed", "--node", "n1", "--since", "0",
                          "--count", "3", "-o", "json")
    )  # fmt: skip
    await eventually(lambda: api.hub.subscriptions == 1)
    await decided(api.bus, "n2", 2)
    await decided(api.bus, "n1", 3)
    await decided(api.bus, "n1", 4)
    code, out, _ = await asyncio.wait_for(tail, 20)
    assert code == 0
    assert [json.loads(line)["data"]["n"] for line in out.splitlines()] == [1, 3, 4]
    code, out, err = await asyncio.to_thread(koordbus, "list", "--node", "n1", "--since", "0", "--limit", "2")
    assert code == 0 and len(out.splitlines()) == 2 and "noderesource.computed" in out and "node=n1" in out
    assert err.startswith("more: --cursor 1-") and err.strip().endswith("-r3")  # every stream a node filter reads
    code, out, _ = await asyncio.to_thread(koordbus, "list", "--node", "n1", "--cursor", err.split()[-1])
    assert code == 0 and len(out.splitlines()) == 1 and '"n":4' in out
    code, out, _ = await asyncio.to_thread(koordbus, "types")
    assert code == 0 and out.splitlines()[0].split()[:3] == ["TYPE", "STREAM", "KEYS"] and "node.eviction" in out
    code, _, err = await asyncio.to_thread(koordbus, "tail", "--type", "nope")
    assert code == 1 and "unknown event type(s) 'nope'" in err


async def test_history_while_the_bus_does_not_answer_is_a_503_not_a_500() -> None:
    """Seen in the soak under load: a stream's bounds asked of a nats-server that did not answer within the API timeout
    raised out of `GET /events` as a 500 with a traceback."""

    class SilentBus(MemoryBus):
        async def stream_bounds(self, stream: str) -> tuple[int, int]:
            raise BusUnavailableError(f"stream info {stream}: nats: timeout")

    bus = SilentBus()
    await bus.ensure_streams(streams.all_streams())
    hub = EventHub(bus)
    context = ApiContext(settings=ApiSettings(), registry=new_registry(), tokens=api_auth.token_store(), event_hub=hub)
    transport = httpx.ASGITransport(app=create_app(context), raise_app_exceptions=False)
    try:
        async with httpx.AsyncClient(transport=transport, base_url="http://api", headers=api_auth.headers()) as api:
            answer = await api.get("/api/v1/events", params={"type": "quota.status"})
        assert answer.status_code == 503, answer.text
        assert "the bus did not answer" in answer.json()["error"]
    finally:
        await hub.close()
