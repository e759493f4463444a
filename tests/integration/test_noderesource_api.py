"""The noderesource routes on SQLite and PostgreSQL: current resources, history with deltas, the colocation config.

Most cases fill NodeResourceStore directly with decisions; one runs NodeResourceService on a MemoryBus with the
store, so its projector and its config recording are what the API serves.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest_asyncio
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import streams, subjects
from bus.memory import MemoryBus
from schemas import vocab
from schemas.noderesource import NodeResourceComputed, ResourceExplanation
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.component import RouteSettings
from services.common.metrics import new_registry
from services.nodemetric import component as nodemetric_component
from services.nodemetric.store import NodeMetricStore
from services.noderesource import component as noderesource_component
from services.noderesource.service import PROJECTOR_CONSUMER, NodeResourceService
from services.noderesource.settings import NodeResourceSettings
from services.noderesource.store import NodeResourceStore
from tests.integration.test_noderesource_service import Clock, eventually, memory_bus_with_streams, publish
from tests.integration.test_noderesource_service import worked_example as publish_worked_example
from tests.support import api_auth
from tests.unit.test_noderesource_state import GI, NODE, T0, config_event, node_event

STREAM = streams.KOORD_NODERESOURCE


def decision(at: float, *, batch_memory: int | None, **fields: Any) -> NodeResourceComputed:
    values: dict[str, Any] = {
        "node": NODE,
        "computed_at": at,
        "trigger": ("nodemetric",),
        "outcome": "computed",
        "resources": {vocab.BATCH_CPU: 25_000, vocab.BATCH_MEMORY: batch_memory},
        "explanation": {
            vocab.BATCH_CPU: ResourceExplanation(value=25_000, message="batch-cpu 25000 = …"),
            vocab.BATCH_MEMORY: ResourceExplanation(value=batch_memory, message=f"batch-memory {batch_memory} = …"),
        },
        "write_due": True,
        "write_reason": "first write",
        **fields,
    }
    return NodeResourceComputed(**values)


def client_for(engine: AsyncEngine, store: NodeResourceStore | None) -> httpx.AsyncClient:
    context = ApiContext(
        settings=ApiSettings(),
        components=(
            nodemetric_component.reads(NodeMetricStore(engine), RouteSettings(clock=lambda: T0)),
            noderesource_component.reads(store),
        ),
        registry=new_registry(),
        tokens=api_auth.token_store(),
    )
    transport = httpx.ASGITransport(app=create_app(context), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://api", headers=api_auth.headers(auth.VIEWER))


@pytest_asyncio.fixture
async def seeded(migrated_engine: AsyncEngine) -> AsyncIterator[httpx.AsyncClient]:
    """Three decisions of node-a: first write, batch-memory drops 146Gi → 100Gi, then degraded (removed)."""
    store = NodeResourceStore(migrated_engine)
    await store.apply_decisions(
        [
            (1, decision(T0, batch_memory=146 * GI)),
            (2, decision(T0 + 60, batch_memory=100 * GI, write_reason="batch-memory moved 31%")),
            (
                3,
                decision(
                    T0 + 120,
                    batch_memory=None,
                    outcome="degraded",
                    reason="NodeMetric stale",
                    trigger=("resync",),
                    resources={vocab.BATCH_CPU: None, vocab.BATCH_MEMORY: None},
                    write_reason="resources removed",
                    last_write_at=T0 + 60,
                    last_write_resources={vocab.BATCH_CPU: 25_000, vocab.BATCH_MEMORY: 100 * GI},
                    meta_due=True,
                    cpu_normalization="disabled (cpu-normalization-config enable: false)",
                ),
            ),
        ],
        consumer=PROJECTOR_CONSUMER,
        stream=STREAM,
    )
    async with client_for(migrated_engine, store) as client:
        yield client


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    return str(response.json()["error"])


async def test_current_resources_show_degraded_with_the_last_write(seeded: httpx.AsyncClient) -> None:
    body = (await seeded.get(f"/api/v1/nodes/{NODE}/resources")).json()
    assert (body["outcome"], body["degraded"], body["disabled"], body["reason"]) == (
        "degraded",
        True,
        False,
        "NodeMetric stale",
    )
    assert body["resources"][vocab.BATCH_MEMORY]["value"] is None
    assert body["resources"][vocab.BATCH_MEMORY]["quantity"] is None
    assert body["writeDue"] is True and body["lastWriteAt"] == "2026-01-01T12:01:00Z"
    assert body["lastWriteResources"][vocab.BATCH_MEMORY] == {"quantity": "100Gi", "value": 100 * GI}
    assert body["lastWriteResources"][vocab.BATCH_CPU] == {
        "quantity": "25k",
        "value": 25_000,
    }  # batch-cpu counts millicores
    assert body["streamSeq"] == 3
    assert body["metaDue"] is True
    assert body["cpuNormalization"] == "disabled (cpu-normalization-config enable: false)"


async def test_unknown_node_is_a_404_on_both_resource_routes(seeded: httpx.AsyncClient) -> None:
    assert "'ghost'" in error_of(await seeded.get("/api/v1/nodes/ghost/resources"), 404)
    assert "'ghost'" in error_of(await seeded.get("/api/v1/nodes/ghost/resources/history"), 404)
    assert "limit" in error_of(await seeded.get(f"/api/v1/nodes/{NODE}/resources/history?limit=0"), 422)


async def test_history_says_what_changed_and_why(seeded: httpx.AsyncClient) -> None:
    body = (await seeded.get(f"/api/v1/nodes/{NODE}/resources/history")).json()
    assert [item["streamSeq"] for item in body["items"]] == [3, 2, 1] and body["complete"] is True
    degraded, dropped, first = body["items"]

    memory = dropped["resources"][vocab.BATCH_MEMORY]
    assert (memory["value"], memory["previous"], memory["delta"], memory["changed"]) == (
        100 * GI,
        146 * GI,
        -46 * GI,
        True,
    )
    assert memory["quantity"] == "100Gi"
    assert dropped["resources"][vocab.BATCH_CPU]["changed"] is False
    (change,) = dropped["changes"]
    assert change["resource"] == vocab.BATCH_MEMORY and change["delta"] == -46 * GI
    assert change["explanation"]["message"] == f"batch-memory {100 * GI} = …"
    assert dropped["writeReason"] == "batch-memory moved 31%" and dropped["writeDue"] is True

    assert degraded["outcome"] == "degraded" and degraded["trigger"] == ["resync"]
    assert {c["resource"] for c in degraded["changes"]} == {vocab.BATCH_CPU, vocab.BATCH_MEMORY}
    assert all(c["delta"] is None and c["value"] is None for c in degraded["changes"])

    assert first["changes"] == [] and first["resources"][vocab.BATCH_MEMORY]["previous"] is None


async def test_a_limited_history_still_diffs_its_oldest_entry(seeded: httpx.AsyncClient) -> None:
    body = (await seeded.get(f"/api/v1/nodes/{NODE}/resources/history?limit=2")).json()
    assert [item["streamSeq"] for item in body["items"]] == [3, 2] and body["complete"] is False
    assert body["items"][1]["resources"][vocab.BATCH_MEMORY]["delta"] == -46 * GI


async def test_without_a_store_the_routes_answer_503(migrated_engine: AsyncEngine) -> None:
    async with client_for(migrated_engine, None) as client:
        for path in (f"/api/v1/nodes/{NODE}/resources", "/api/v1/config/colocation"):
            assert "noderesource" in error_of(await client.get(path), 503)


async def test_config_before_anything_was_recorded(migrated_engine: AsyncEngine) -> None:
    async with client_for(migrated_engine, NodeResourceStore(migrated_engine)) as client:
        body = (await client.get("/api/v1/config/colocation")).json()
    assert body == {"available": False, "error": None, "updatedAt": None, "cluster": None, "nodes": {}}


async def test_every_route_is_documented(seeded: httpx.AsyncClient) -> None:
    paths = (await seeded.get("/openapi.json")).json()["paths"]
    for path in (
        "/api/v1/nodes/{node}/resources",
        "/api/v1/nodes/{node}/resources/history",
        "/api/v1/config/colocation",
    ):
        operation = paths[path]["get"]
        assert operation["summary"] and operation["description"]


async def test_the_service_projects_decisions_and_records_the_config(
    memory_bus: MemoryBus, migrated_engine: AsyncEngine
) -> None:
    bus = await memory_bus_with_streams(memory_bus)
    await publish_worked_example(bus)
    store = NodeResourceStore(migrated_engine)
    svc = NodeResourceService(
        bus,
        NodeResourceSettings(startup_timeout_seconds=10),
        registry=new_registry(),
        clock=Clock(T0 + 30),
        store=store,
    )
    await svc.start()
    try:
        async with client_for(migrated_engine, store) as client:
            await eventually(lambda: _status_is(client, f"/api/v1/nodes/{NODE}/resources", 200))
            current = (await client.get(f"/api/v1/nodes/{NODE}/resources")).json()
            assert current["resources"][vocab.BATCH_MEMORY]["quantity"] == "146Gi"
            assert current["resources"][vocab.BATCH_CPU]["value"] == 25_000
            assert "25000" in current["resources"][vocab.BATCH_CPU]["explanation"]["message"]

            config = (await client.get("/api/v1/config/colocation")).json()
            assert config["available"] is True and config["error"] is None
            assert config["cluster"]["enable"] is True
            assert config["nodes"][NODE]["nodeConfig"] == ""
            assert config["nodes"][NODE]["strategy"]["cpuReclaimThresholdPercent"] == 60

            # A rejected ConfigMap keeps the config in effect and says why; a ratio label changes the node strategy.
            await publish(bus, config_event({"enable": "yes"}, rv="2"), node_event(rv="2", labels={_CPU_RATIO: "0.7"}))
            await eventually(lambda: _config_error(client))
            config = (await client.get("/api/v1/config/colocation")).json()
            assert config["cluster"]["enable"] is True and "colocation-config" in config["error"]
            assert config["nodes"][NODE]["strategy"]["cpuReclaimThresholdPercent"] == 70
            await eventually(lambda: _history_length_is(client, 2))  # the projector writes after its linger
            history = (await client.get(f"/api/v1/nodes/{NODE}/resources/history")).json()
            assert history["items"][0]["trigger"] == ["node"]
    finally:
        await svc.stop()
    last = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed(NODE))
    assert last is not None  # the second decision (the stream also holds the config error's status)
    assert await store.offset(PROJECTOR_CONSUMER) == last.stream_seq and last.stream_seq in (2, 3)


async def test_a_stop_projects_the_decisions_its_last_tick_published(
    memory_bus: MemoryBus, migrated_engine: AsyncEngine
) -> None:
    # A replica stopped just after its resync tick published (the failover run's last moments, seed 428446417):
    # its projection must hold what it published, not stop one batch short of it.
    bus = await memory_bus_with_streams(memory_bus)
    await publish_worked_example(bus)
    store = NodeResourceStore(migrated_engine)
    clock = Clock(T0 + 30)
    svc = NodeResourceService(
        bus, NodeResourceSettings(startup_timeout_seconds=10), registry=new_registry(), clock=clock, store=store
    )
    await svc.start()
    try:
        first = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed(NODE))
        assert first is not None
        await eventually(lambda: _offset_is(store, first.stream_seq))
        clock.now = T0 + 3600  # the NodeMetric long stale: the tick degrades the node
        await svc.resync()
    finally:
        await svc.stop()
    last = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed(NODE))
    assert last is not None and last.stream_seq > first.stream_seq
    assert await store.offset(PROJECTOR_CONSUMER) == last.stream_seq
    assert [r.decision.outcome for r in await store.history(NODE, limit=5)] == ["degraded", "computed"]


async def _offset_is(store: NodeResourceStore, seq: int) -> bool:
    return await store.offset(PROJECTOR_CONSUMER) == seq


_CPU_RATIO = "node.koordinator.sh/cpu-reclaim-ratio"


async def _history_length_is(client: httpx.AsyncClient, length: int) -> bool:
    return len((await client.get(f"/api/v1/nodes/{NODE}/resources/history")).json()["items"]) == length


async def _status_is(client: httpx.AsyncClient, path: str, status: int) -> bool:
    return (await client.get(path)).status_code == status


async def _config_error(client: httpx.AsyncClient) -> bool:
    body = (await client.get("/api/v1/config/colocation")).json()
    strategy = body["nodes"].get(NODE, {}).get("strategy", {})
    return bool(body["error"]) and strategy.get("cpuReclaimThresholdPercent") == 70


async def test_numa_zones_are_shown_with_their_explanations(migrated_engine: AsyncEngine) -> None:
    store = NodeResourceStore(migrated_engine)
    zoned = decision(
        T0,
        batch_memory=146 * GI,
        trigger=("topology",),
        zones={"node-0": {vocab.BATCH_CPU: 6_900, vocab.BATCH_MEMORY: 70 * GI}},
        zone_explanation={"node-0": {vocab.BATCH_CPU: ResourceExplanation(value=6_900, message="zone batch-cpu 6900")}},
    )
    await store.apply_decisions([(1, zoned)], consumer=PROJECTOR_CONSUMER, stream=STREAM)
    async with client_for(migrated_engine, store) as client:
        body = (await client.get(f"/api/v1/nodes/{NODE}/resources")).json()
    assert body["trigger"] == ["topology"]
    zone = body["zones"]["node-0"]
    assert zone[vocab.BATCH_CPU]["value"] == 6_900
    assert zone[vocab.BATCH_CPU]["explanation"]["message"] == "zone batch-cpu 6900"
    assert zone[vocab.BATCH_MEMORY] == {"value": 70 * GI, "explanation": None}
