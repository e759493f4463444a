"""The API gateway on SQLite and PostgreSQL: routes, error shapes, pagination, staleness, readiness, metrics, docs.

The store is filled directly with the events nodemetric would project (NodeMetricComputed, NodeSeen,
NodeStateReported); a bus appears only where readiness or consumer metrics need one.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import streams, subjects
from bus.api import ConsumerStats, StreamSpec
from bus.jetstream import JetStreamBus
from bus.memory import MemoryBus
from schemas.node import (
    NodeMetricComputedRecord,
    NodeMetricsReported,
    NodeStateReported,
    PodRef,
    encode_node_event,
)
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth, db, observe
from services.common.component import RouteSettings
from services.common.metrics import CollectorRegistry, new_registry, render
from services.nodemetric import component as nodemetric_component
from services.nodemetric.service import INGEST_CONSUMER, PROJECTOR_CONSUMER, NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore, NodeSeen
from tests.support import api_auth
from tests.support.crd import assert_valid_nodemetric
from tests.support.events import nodemetric_computed
from tests.support.events import nodemetric_record as computed

NOW = 1_750_000_000.0
STALE_AFTER = 180.0
FRESH_NODE = "node-fresh.example"
STALE_NODE = "node-stale.example"


def state(node: str, at: float) -> NodeStateReported:
    return NodeStateReported(
        node=node,
        at=at,
        agent_version="0.1.0",
        cpu_cores=16.0,
        memory_total=64 << 30,
        cgroup_version=2,
        cgroup_driver="systemd",
        pods=[PodRef(uid="p-1", kube_qos="BestEffort"), PodRef(uid="p-2", kube_qos="Guaranteed")],
    )


async def seed_node(store: NodeMetricStore, node: str, *, first: float, last: float, seq: int) -> None:
    """A node that sent state at `first`, batches up to `last` (one of them after 2 dropped), and got a report."""
    await store.apply_node_events(
        [
            (seq, state(node, first)),
            (seq + 1, NodeSeen(node=node, window_end=first + 10)),
            (seq + 2, NodeSeen(node=node, window_end=last, dropped_batches=2)),
        ],
        consumer=INGEST_CONSUMER,
        stream=streams.KOORD_NODE,
    )
    await store.apply_computed(
        [(seq, computed(node, last - last % 60))], consumer=PROJECTOR_CONSUMER, stream=streams.KOORD_NODEMETRIC
    )


@pytest.fixture
def store(migrated_engine: AsyncEngine) -> NodeMetricStore:
    return NodeMetricStore(migrated_engine)


def make_context(store: NodeMetricStore, *, clock: Callable[[], float] = lambda: NOW, **overrides: Any) -> ApiContext:
    route_settings = RouteSettings(stale_after_seconds=STALE_AFTER, page_limit_max=50, clock=clock)
    values: dict[str, Any] = {
        "settings": ApiSettings(stale_after_seconds=STALE_AFTER, page_limit_max=50),
        "components": (nodemetric_component.reads(store, route_settings),),
        "registry": new_registry(),
        "tokens": api_auth.token_store(),
        **overrides,
    }
    return ApiContext(**values)


def client_for(context: ApiContext) -> httpx.AsyncClient:
    app = create_app(context)
    # raise_app_exceptions=False: a 500 must come back as a response, exactly as a real client would see it.
    transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://api", headers=api_auth.headers(auth.VIEWER))


@pytest_asyncio.fixture
async def seeded(store: NodeMetricStore) -> AsyncIterator[httpx.AsyncClient]:
    await seed_node(store, FRESH_NODE, first=NOW - 3600, last=NOW - 30, seq=1)
    await seed_node(store, STALE_NODE, first=NOW - 7200, last=NOW - 600, seq=10)
    async with client_for(make_context(store)) as client:
        yield client


def assert_error(response: httpx.Response, status: int, *fragments: str) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    body = response.json()
    assert set(body) >= {"error"} and isinstance(body["error"], str)
    for fragment in fragments:
        assert fragment in body["error"]
    assert "Traceback" not in response.text
    return str(body["error"])


# --- NodeMetric objects


async def test_nodemetric_is_a_valid_crd_object_annotated_fresh_or_stale(seeded: httpx.AsyncClient) -> None:
    fresh = (await seeded.get(f"/api/v1/nodemetrics/{FRESH_NODE}")).json()
    stale = (await seeded.get(f"/api/v1/nodemetrics/{STALE_NODE}")).json()

    for obj in (fresh, stale):
        assert_valid_nodemetric(obj)
    assert fresh["metadata"]["annotations"] == {
        "koordbus.io/stale": "false",
        "koordbus.io/last-sample-time": "2025-06-15T15:06:10Z",
    }
    assert stale["metadata"]["annotations"]["koordbus.io/stale"] == "true"
    assert stale["metadata"]["annotations"]["koordbus.io/last-sample-time"] == "2025-06-15T14:56:40Z"
    assert fresh["status"]["nodeMetric"]["nodeUsage"]["resources"] == {"cpu": "1500m", "memory": "6Gi"}
    (pod,) = fresh["status"]["podsMetric"]
    assert (pod["name"], pod["qos"], pod["podUsage"]["resources"]["memory"]) == ("batch-0", "BE", "300Mi")


async def test_unknown_nodemetric_is_a_json_404_naming_the_node(seeded: httpx.AsyncClient) -> None:
    assert_error(await seeded.get("/api/v1/nodemetrics/ghost-node"), 404, "'ghost-node'")


async def test_nodemetric_pages_walk_every_node_exactly_once(store: NodeMetricStore) -> None:
    names = [f"node-{i:02d}" for i in range(7)]
    for i, name in enumerate(reversed(names)):  # inserted out of order: the order comes from the name
        await seed_node(store, name, first=NOW - 900, last=NOW - 10 * i, seq=100 + 10 * i)

    async with client_for(make_context(store)) as client:
        pages = await walk(client, "/api/v1/nodemetrics", limit=3)

    assert [len(page["items"]) for page in pages] == [3, 3, 1]
    assert [item["metadata"]["name"] for page in pages for item in page["items"]] == names
    assert [page["metadata"].get("continue") for page in pages] == ["node-02", "node-05", None]
    for page in pages:
        assert (page["kind"], page["apiVersion"]) == ("NodeMetricList", "slo.koordinator.sh/v1alpha1")
        for item in page["items"]:
            assert_valid_nodemetric(item)


async def test_a_page_exactly_as_long_as_the_list_has_no_continue(seeded: httpx.AsyncClient) -> None:
    body = (await seeded.get("/api/v1/nodemetrics", params={"limit": 2})).json()
    assert len(body["items"]) == 2
    assert body["metadata"] == {}


async def walk(client: httpx.AsyncClient, path: str, *, limit: int, **params: Any) -> list[dict[str, Any]]:
    """Follow metadata.continue until a page has none; fails on a loop."""
    pages: list[dict[str, Any]] = []
    after: str | None = None
    while len(pages) < 20:
        query = {"limit": limit, **params, **({"after": after} if after else {})}
        response = await client.get(path, params=query)
        assert response.status_code == 200, response.text
        pages.append(response.json())
        after = pages[-1]["metadata"].get("continue")
        if after is None:
            return pages
    raise AssertionError("pagination did not end")


# --- node liveness


async def test_nodes_show_liveness_capacity_and_cgroup_layout(seeded: httpx.AsyncClient) -> None:
    body = (await seeded.get("/api/v1/nodes")).json()

    assert body["kind"] == "NodeLivenessList" and body["metadata"] == {}
    fresh, stale = body["items"]
    assert fresh == {
        "name": FRESH_NODE,
        "firstSampleTime": "2025-06-15T14:06:40Z",
        "lastSampleTime": "2025-06-15T15:06:10Z",
        "secondsSinceLastSample": 30.0,
        "stale": False,
        "cgroupVersion": 2,
        "cgroupDriver": "systemd",
        "cpuCores": 16.0,
        "memoryTotalBytes": 64 << 30,
        "pods": 1,  # its NodeMetric's one pod (the state report, older, named two)
        "agentVersion": "0.1.0",
        "droppedBatches": 2,
    }
    assert (stale["name"], stale["stale"], stale["secondsSinceLastSample"]) == (STALE_NODE, True, 600.0)
    one = (await seeded.get(f"/api/v1/nodes/{STALE_NODE}")).json()
    assert one == stale


async def test_a_nodes_pods_are_its_nodemetrics_and_its_state_reports_before_the_first(
    store: NodeMetricStore,
) -> None:
    """The node page's pod count comes from the same report as its usage (issue 27: a simulated node showed
    "pods 0" next to 15 cores of pod usage, its state report naming no pods); before the first NodeMetric it is
    what the agent's state report named."""
    node = "node-new.example"
    await store.apply_node_events([(1, state(node, NOW - 20))], consumer=INGEST_CONSUMER, stream=streams.KOORD_NODE)
    async with client_for(make_context(store)) as client:
        assert (await client.get(f"/api/v1/nodes/{node}")).json()["pods"] == 2
        report = nodemetric_computed(node, NOW - 60)
        three = msgspec.structs.replace(report.status, pods_metric=[*report.status.pods_metric] * 3)
        record = NodeMetricComputedRecord.of(msgspec.structs.replace(report, status=three))
        await store.apply_computed([(1, record)], consumer=PROJECTOR_CONSUMER, stream=streams.KOORD_NODEMETRIC)
        assert (await client.get(f"/api/v1/nodes/{node}")).json()["pods"] == 3
        assert [n["pods"] for n in (await client.get("/api/v1/nodes")).json()["items"]] == [3]


async def test_staleness_follows_the_clock(store: NodeMetricStore) -> None:
    await seed_node(store, FRESH_NODE, first=NOW - 3600, last=NOW - 30, seq=1)
    now = [NOW]
    async with client_for(make_context(store, clock=lambda: now[0])) as client:
        before = (await client.get(f"/api/v1/nodes/{FRESH_NODE}")).json()
        now[0] = NOW - 30 + STALE_AFTER + 1  # just past the threshold
        after = (await client.get(f"/api/v1/nodes/{FRESH_NODE}")).json()
        metric = (await client.get(f"/api/v1/nodemetrics/{FRESH_NODE}")).json()

    assert before["stale"] is False
    assert after["stale"] is True
    assert metric["metadata"]["annotations"]["koordbus.io/stale"] == "true"


async def test_nodes_filter_by_staleness(seeded: httpx.AsyncClient) -> None:
    stale = (await seeded.get("/api/v1/nodes", params={"stale": "true"})).json()
    fresh = (await seeded.get("/api/v1/nodes", params={"stale": "false"})).json()

    assert [n["name"] for n in stale["items"]] == [STALE_NODE]
    assert [n["name"] for n in fresh["items"]] == [FRESH_NODE]


async def test_node_pages_walk_every_node_exactly_once_even_when_filtered(store: NodeMetricStore) -> None:
    names = [f"n{i}" for i in range(9)]
    for i, name in enumerate(names):
        last = NOW - (600 if i % 3 == 0 else 5)  # n0, n3, n6 are stale
        await seed_node(store, name, first=NOW - 3600, last=last, seq=10 * i + 1)

    async with client_for(make_context(store)) as client:
        pages = await walk(client, "/api/v1/nodes", limit=4)
        stale_pages = await walk(client, "/api/v1/nodes", limit=2, stale="true")

    assert [n["name"] for page in pages for n in page["items"]] == names
    assert [page["metadata"].get("continue") for page in pages] == ["n3", "n7", None]
    assert [n["name"] for page in stale_pages for n in page["items"]] == ["n0", "n3", "n6"]


async def test_unknown_node_is_a_json_404(seeded: httpx.AsyncClient) -> None:
    assert_error(await seeded.get("/api/v1/nodes/ghost-node"), 404, "'ghost-node'", "never reported")


# --- error shapes


@pytest.mark.parametrize(
    ("path", "fragments"),
    [
        ("/api/v1/nodemetrics?limit=0", ("'limit'", "'0'", "greater than or equal to 1")),
        ("/api/v1/nodemetrics?limit=abc", ("'limit'", "'abc'", "valid integer")),
        ("/api/v1/nodemetrics?limit=51", ("'limit'", "51", "at most 50")),
        ("/api/v1/nodes?limit=-3", ("'limit'", "'-3'")),
        ("/api/v1/nodes?stale=maybe", ("'stale'", "'maybe'", "boolean")),
    ],
)
async def test_bad_query_parameters_are_a_json_422_naming_the_parameter(
    seeded: httpx.AsyncClient, path: str, fragments: tuple[str, ...]
) -> None:
    assert_error(await seeded.get(path), 422, *fragments)


async def test_wrong_method_is_a_json_405_with_allow(seeded: httpx.AsyncClient) -> None:
    response = await seeded.post("/api/v1/nodemetrics", json={})
    assert_error(response, 405, "POST", "/api/v1/nodemetrics")
    assert response.headers["allow"] == "GET"


async def test_unknown_route_is_a_json_404(seeded: httpx.AsyncClient) -> None:
    assert_error(await seeded.get("/api/v2/everything"), 404, "GET /api/v2/everything")


class _BrokenStore(NodeMetricStore):
    async def get(self, node: str) -> None:
        raise RuntimeError("password=hunter2 leaked in a driver message")


async def test_unexpected_errors_are_a_json_500_without_details(
    migrated_engine: AsyncEngine, caplog: pytest.LogCaptureFixture
) -> None:
    async with client_for(make_context(_BrokenStore(migrated_engine))) as client:
        response = await client.get("/api/v1/nodemetrics/node-a")

    message = assert_error(response, 500, "RuntimeError", "server log")
    assert "hunter2" not in response.text and "hunter2" not in message
    # The details go to the log, with the traceback, exactly once.
    logged = [r for r in caplog.records if r.exc_info and "hunter2" in str(r.exc_info[1])]
    assert len(logged) == 1


# --- docs


async def test_openapi_and_docs_are_served(seeded: httpx.AsyncClient) -> None:
    docs = await seeded.get("/docs")
    spec = (await seeded.get("/openapi.json")).json()

    assert docs.status_code == 200 and "swagger" in docs.text.lower()
    paths = spec["paths"]
    assert {"/api/v1/nodes", "/api/v1/nodes/{node}", "/api/v1/nodemetrics", "/readyz", "/metrics"} <= set(paths)
    not_found = paths["/api/v1/nodemetrics/{node}"]["get"]["responses"]["404"]
    assert not_found["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorBody"}
    listed = paths["/api/v1/nodes"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert listed == {"$ref": "#/components/schemas/NodeLivenessList"}


# --- readiness


async def test_ready_when_database_and_bus_answer_then_503_after_dispose(
    database_url: str, jetstream_bus: JetStreamBus
) -> None:
    stream = await _private_stream(jetstream_bus, "readyz-db")
    await db.run_migrations(database_url)
    engine = db.create_engine(database_url)
    checks = (("database", observe.database_ready(engine)), ("bus", observe.bus_ready(jetstream_bus, stream=stream)))
    async with client_for(make_context(NodeMetricStore(engine), readiness=checks)) as client:
        ready = await client.get("/readyz")
        await engine.dispose()
        after_dispose = await client.get("/readyz")

    assert ready.status_code == 200
    assert ready.json() == {"status": "ready", "checked": ["database", "bus"]}
    assert_error(after_dispose, 503, "database", "disposed")
    assert set(after_dispose.json()["failures"]) == {"database"}


async def test_not_ready_when_the_database_is_unreachable_or_unmigrated(database_url: str, tmp_path: Any) -> None:
    unreachable_url, expected_reason = (
        (f"sqlite:///{tmp_path / 'no-such-dir' / 'x.db'}", "unable to open database file")
        if database_url.startswith("sqlite")
        else ("postgresql://postgres@127.0.0.1:1/postgres", "ConnectionRefusedError")
    )
    unreachable = db.create_engine(unreachable_url)
    unmigrated = db.create_engine(database_url)
    checks = (("database", observe.database_ready(unreachable)), ("projections", observe.database_ready(unmigrated)))
    try:
        async with client_for(make_context(NodeMetricStore(unmigrated), readiness=checks)) as client:
            response = await client.get("/readyz")
    finally:
        await unreachable.dispose()
        await unmigrated.dispose()

    message = assert_error(response, 503, "not ready", "database (", "projections (")
    failures = response.json()["failures"]
    assert expected_reason in failures["database"], message
    assert "not migrated" in failures["projections"]


async def test_not_ready_once_the_bus_is_closed(nats_url: str, store: NodeMetricStore) -> None:
    bus = await JetStreamBus.connect(nats_url, name="readyz-bus")
    stream = await _private_stream(bus, "readyz-bus")
    checks = (("bus", observe.bus_ready(bus, stream=stream)),)
    async with client_for(make_context(store, readiness=checks)) as client:
        ready = await client.get("/readyz")
        await bus.close()
        closed = await client.get("/readyz")

    assert ready.status_code == 200
    assert_error(closed, 503, "not ready: bus (")
    assert "BusUnavailableError" in closed.json()["failures"]["bus"]


async def test_failing_raising_and_hanging_checks_are_each_named(store: NodeMetricStore) -> None:
    async def fine() -> str | None:
        return None

    async def says_no() -> str | None:
        return "kv bucket node-slo missing"

    async def raises() -> str | None:
        raise ConnectionResetError("peer went away")

    async def hangs() -> str | None:
        await asyncio.sleep(30)
        return None

    checks: tuple[tuple[str, Callable[[], Awaitable[str | None]]], ...] = (
        ("database", fine),
        ("kv", says_no),
        ("k8s", raises),
        ("slow", hangs),
    )
    context = make_context(store, readiness=checks, readiness_timeout_seconds=0.2)
    async with client_for(context) as client:
        response = await client.get("/readyz")

    assert_error(response, 503, "kv (kv bucket node-slo missing)", "k8s (", "slow (")
    assert response.json()["failures"] == {
        "kv": "kv bucket node-slo missing",
        "k8s": "ConnectionResetError: peer went away",
        "slow": "no answer within 0.2 s",
    }


async def _private_stream(bus: JetStreamBus, name: str) -> str:
    """The session nats-server is shared: readiness tests probe a stream of their own."""
    stream = f"TEST_{name.upper().replace('-', '_')}"
    await bus.ensure_streams(
        [StreamSpec(name=stream, subjects=(f"test.{name}.>",), max_age_seconds=600, storage="memory")]
    )
    return stream


# --- metrics


def samples(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """{sorted labels: value} of one sample name in a Prometheus text exposition."""
    found: dict[tuple[tuple[str, str], ...], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sorted(sample.labels.items()))] = sample.value
    return found


INGEST_LABELS = (("consumer", INGEST_CONSUMER), ("service", "nodemetric"))
PROJECTOR_LABELS = (("consumer", PROJECTOR_CONSUMER), ("service", "nodemetric"))


async def test_metrics_expose_nodemetric_and_consumer_counters_across_a_restart(store: NodeMetricStore) -> None:
    bus = MemoryBus()
    await bus.ensure_streams(streams.all_streams())
    registry = new_registry()
    service = NodeMetricService(bus, store, NodeMetricSettings(), registry=registry)
    context = make_context(store, registry=registry, before_metrics=(service.refresh_gauges,))
    try:
        async with client_for(context) as client:
            await service.start()
            await _publish_batch(bus, 0)
            await _idle(service)
            first = (await client.get("/metrics")).text
            await service.stop()
            await service.start()  # same registry, same process: must not collide
            await _publish_batch(bus, 1)
            await _idle(service)
            response = await client.get("/metrics")
    finally:
        await service.stop()
        await bus.close()

    assert response.headers["content-type"].startswith("text/plain")
    second = response.text
    assert samples(first, "koordbus_consumer_delivered_total")[INGEST_LABELS] == 1.0
    # The restarted ingest replays batch 0 and delivers batch 1: counters add up instead of starting over.
    delivered = samples(second, "koordbus_consumer_delivered_total")
    assert delivered[INGEST_LABELS] == 1.0 + 2.0
    assert samples(second, "koordbus_consumer_acked_total")[INGEST_LABELS] == 3.0
    assert samples(second, "koordbus_consumer_dead_lettered_total") == {INGEST_LABELS: 0.0, PROJECTOR_LABELS: 0.0}
    for name in ("naked", "termed", "flush_failures", "fetch_errors"):
        assert samples(second, f"koordbus_consumer_{name}_total")[INGEST_LABELS] == 0.0
    assert samples(second, "koordbus_nodemetric_batches_total")[()] == 3.0
    assert samples(second, "koordbus_nodemetric_nodes")[()] == 1.0
    assert "koordbus_nodemetric_ingest_latency_seconds_bucket" in second


async def _publish_batch(bus: MemoryBus, index: int) -> None:
    start = NOW + 10 * index
    batch = NodeMetricsReported(
        node="node-m",
        window_start=start,
        window_end=start + 10,
        sent_at=start + 10,
        node_samples=[(start + s, 1.0, 1 << 30) for s in range(10)],
    )
    await bus.publish(subjects.node_metrics("node-m"), encode_node_event(batch), msg_id=f"node-m:{start}")


async def _idle(service: NodeMetricService) -> None:
    for consumer in service.consumers:
        assert await consumer.wait_idle(10)


class _FakeConsumer:
    def __init__(self, **counts: int) -> None:
        self._stats = ConsumerStats(**counts)

    @property
    def stats(self) -> ConsumerStats:
        return self._stats

    async def stop(self) -> None:
        return None

    async def wait_idle(self, timeout: float) -> bool:
        return True


def test_consumer_collector_is_shared_per_registry_and_keeps_counts_monotonic() -> None:
    registry: CollectorRegistry = new_registry()
    first = _FakeConsumer(delivered=5, dead_lettered=2)
    observe.watch_consumers(registry, service="quota", consumers={"quota-commands": first})
    observe.watch_consumers(registry, service="nodemetric", consumers={"nodemetric-ingest": _FakeConsumer(acked=7)})
    first.stats.delivered = 6  # read at scrape time, not at registration
    observe.retire_consumers(registry, service="quota", names=["quota-commands"])
    first.stats.delivered = 100  # a retired consumer no longer counts
    observe.watch_consumers(registry, service="quota", consumers={"quota-commands": _FakeConsumer(delivered=1)})

    assert observe.collector_for(registry) is observe.collector_for(registry)
    quota = (("consumer", "quota-commands"), ("service", "quota"))
    text = _render(registry)
    assert samples(text, "koordbus_consumer_delivered_total")[quota] == 7.0
    assert samples(text, "koordbus_consumer_dead_lettered_total")[quota] == 2.0
    ingest = (("consumer", "nodemetric-ingest"), ("service", "nodemetric"))
    assert samples(text, "koordbus_consumer_acked_total")[ingest] == 7.0
    assert text.count("# TYPE koordbus_consumer_delivered_total counter") == 1
    # Another registry has its own collector and sees none of this.
    assert samples(_render(new_registry()), "koordbus_consumer_delivered_total") == {}


def _render(registry: CollectorRegistry) -> str:
    return render(registry).decode()
