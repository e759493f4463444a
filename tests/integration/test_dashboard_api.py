"""The dashboard's server side on SQLite and PostgreSQL: `/api/v1/overview/nodes` joins liveness, NodeMetric usage
(with the batch and mid pods' share) and the latest batch/mid resources per node, pages by name without skipping or
repeating a node, needs a token; `/` and `/ui/…` serve the static pages without one."""

from __future__ import annotations

import re
from typing import Any

import httpx
import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import streams
from schemas import vocab
from schemas.node import NodeMetricComputedRecord, PodMetric
from services.api import dashboard
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.component import RouteSettings
from services.common.metrics import new_registry
from services.nodemetric import component as nodemetric_component
from services.nodemetric.service import INGEST_CONSUMER, PROJECTOR_CONSUMER
from services.nodemetric.store import NodeMetricStore, NodeSeen
from services.noderesource import component as noderesource_component
from services.noderesource.service import PROJECTOR_CONSUMER as NR_PROJECTOR
from services.noderesource.store import NodeResourceStore
from tests.integration.test_api import state
from tests.integration.test_noderesource_api import decision
from tests.support import api_auth
from tests.support.events import nodemetric_computed, usage
from tests.unit.test_noderesource_state import NODE

NOW = 1_750_000_000.0
GI = 1 << 30


def client_for(engine: AsyncEngine, *, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    context = ApiContext(
        settings=ApiSettings(stale_after_seconds=180.0),
        components=(
            nodemetric_component.reads(
                NodeMetricStore(engine), RouteSettings(stale_after_seconds=180.0, clock=lambda: NOW)
            ),
            noderesource_component.reads(NodeResourceStore(engine)),
        ),
        registry=new_registry(),
        tokens=api_auth.token_store(),
    )
    transport = httpx.ASGITransport(app=create_app(context), raise_app_exceptions=False)
    sent = api_auth.headers(auth.VIEWER) if headers is None else headers
    return httpx.AsyncClient(transport=transport, base_url="http://api", headers=sent)


def with_mid_pod(node: str, report_time: float) -> NodeMetricComputedRecord:
    """The support report (one koord-batch pod using 500m / 300Mi) plus a koord-mid pod and a prod pod."""
    base = nodemetric_computed(node, report_time, cpu_milli=4000)
    pods = [
        *base.status.pods_metric,
        PodMetric(namespace="ml", name="mid-0", pod_usage=usage(250, 100 << 20), priority="koord-mid"),
        PodMetric(namespace="web", name="prod-0", pod_usage=usage(2000, 1 << 30), priority="koord-prod"),
    ]
    status = msgspec.structs.replace(base.status, pods_metric=pods)
    return NodeMetricComputedRecord.of(msgspec.structs.replace(base, status=status))


async def seed(engine: AsyncEngine) -> None:
    store = NodeMetricStore(engine)
    # NODE (from the noderesource fixtures) reports and has a decision; "a-quiet" went stale; "z-new" has no
    # NodeMetric yet.
    events: list[tuple[int, Any]] = []
    for i, (node, last) in enumerate([(NODE, NOW - 20), ("a-quiet", NOW - 900), ("z-new", NOW - 5)]):
        events += [(3 * i + 1, state(node, last - 600)), (3 * i + 2, NodeSeen(node=node, window_end=last))]
    await store.apply_node_events(events, consumer=INGEST_CONSUMER, stream=streams.KOORD_NODE)
    await store.apply_computed(
        [
            (1, with_mid_pod(NODE, NOW - 60)),
            (2, NodeMetricComputedRecord.of(nodemetric_computed("a-quiet", NOW - 960))),
        ],
        consumer=PROJECTOR_CONSUMER,
        stream=streams.KOORD_NODEMETRIC,
    )
    await NodeResourceStore(engine).apply_decisions(
        [(1, decision(NOW - 50, batch_memory=146 * GI))], consumer=NR_PROJECTOR, stream=streams.KOORD_NODERESOURCE
    )


async def test_overview_rows_join_liveness_usage_and_batch_resources(migrated_engine: AsyncEngine) -> None:
    await seed(migrated_engine)
    async with client_for(migrated_engine) as client:
        response = await client.get("/api/v1/overview/nodes")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["continue"] is None and body["staleAfterSeconds"] == 180.0 and body["now"] == NOW
    rows = {row["name"]: row for row in body["items"]}
    assert list(rows) == ["a-quiet", NODE, "z-new"]
    reporting = rows[NODE]
    assert reporting["stale"] is False and reporting["lastSample"] == NOW - 20
    assert (reporting["cpuCores"], reporting["memoryTotal"]) == (16.0, 64 << 30)
    assert (reporting["cpuUsed"], reporting["memoryUsed"]) == (4000, 6 << 30)
    assert (reporting["batchCpuUsed"], reporting["batchMemoryUsed"]) == (500, 300 << 20)
    assert (reporting["midCpuUsed"], reporting["midMemoryUsed"]) == (250, 100 << 20)
    assert (reporting["batchCpu"], reporting["batchMemory"], reporting["outcome"]) == (25_000, 146 * GI, "computed")
    assert reporting["resourcesAt"] == NOW - 50  # decided after the NodeMetric of NOW - 60: the page can tell
    assert reporting["midCpu"] is None
    assert rows["a-quiet"]["stale"] is True and rows["a-quiet"]["cpuUsed"] == 1500
    assert rows["a-quiet"]["batchCpu"] is None and rows["a-quiet"]["outcome"] is None
    assert rows["a-quiet"]["resourcesAt"] is None
    assert rows["z-new"]["cpuUsed"] is None and rows["z-new"]["reportTime"] is None
    # pods: the NodeMetric's (three on NODE, one on a-quiet); z-new, without one yet, its state report's two
    assert [row["pods"] for row in rows.values()] == [1, 3, 2]


async def test_overview_pages_by_name_and_joins_within_each_page(migrated_engine: AsyncEngine) -> None:
    await seed(migrated_engine)
    seen: list[dict[str, Any]] = []
    after: str | None = None
    async with client_for(migrated_engine) as client:
        for _ in range(5):
            params: dict[str, Any] = {"limit": 1, **({"after": after} if after else {})}
            page = (await client.get("/api/v1/overview/nodes", params=params)).json()
            seen += page["items"]
            after = page["continue"]
            if after is None:
                break
        too_big = await client.get("/api/v1/overview/nodes", params={"limit": dashboard.OVERVIEW_PAGE_MAX + 1})
    assert [row["name"] for row in seen] == ["a-quiet", NODE, "z-new"]
    # each one-row page still found that row's NodeMetric and decision (joined over the page's name range)
    assert [row["cpuUsed"] for row in seen] == [1500, 4000, None]
    assert [row["batchCpu"] for row in seen] == [None, 25_000, None]
    assert too_big.status_code == 422


async def test_overview_needs_a_token_but_the_pages_do_not(migrated_engine: AsyncEngine) -> None:
    async with client_for(migrated_engine, headers={}) as client:
        refused = await client.get("/api/v1/overview/nodes")
        index = await client.get("/")
        module = await client.get("/ui/sse.js")
        missing = await client.get("/ui/nothing-here.js")
    assert refused.status_code == 401
    assert index.status_code == 200 and index.headers["content-type"].startswith("text/html")
    assert '<script type="module" src="/ui/app.js">' in index.text
    assert module.status_code == 200 and "javascript" in module.headers["content-type"]
    assert "export class SseParser" in module.text
    assert missing.status_code == 404


def test_every_module_the_pages_import_is_shipped() -> None:
    """The static directory is package data: every relative import of every module names a file that is there."""
    files = {p.name for p in dashboard.STATIC_DIR.iterdir()}
    assert {"index.html", "app.js", "style.css"} <= files
    for module in dashboard.STATIC_DIR.glob("*.js"):
        for imported in re.findall(r'from "\./([^"]+)"', module.read_text()):
            assert imported in files, f"{module.name} imports ./{imported}, which is not shipped"
    assert vocab.BATCH_CPU in (dashboard.STATIC_DIR / "overview.js").read_text()
