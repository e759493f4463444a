"""End to end on real components: agent (generated cgroup tree) → nats-server → nodemetric → database → API.

Also the recovery promise: a nodemetric service killed mid-stream and restarted projects exactly
what a clean replay of the same stream into a fresh database projects.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
from sqlalchemy import text

from agent.service import AgentService
from agent.settings import AgentSettings
from bus import streams
from bus.jetstream import JetStreamBus
from koordbus import simulation
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import db
from services.common.metrics import new_registry
from services.nodemetric import component as nodemetric_component
from services.nodemetric.service import NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore
from tests.cgroup_tree import FakeCgroupTree
from tests.support import api_auth
from tests.support.crd import assert_valid_nodemetric

NODE = "node-a.example"
POD_UID = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
CONTAINER_ID = "a" * 64


async def eventually(check: Callable[[], Awaitable[bool]], *, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await check():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.1)


async def test_agent_to_api_on_a_generated_cgroup_tree(
    tmp_path: Path, koordbus_bus: JetStreamBus, database_url: str
) -> None:
    bus = koordbus_bus
    tree = FakeCgroupTree(root=tmp_path / "node", version=2, driver="systemd")
    tree.proc.cpus = 4
    pod = tree.add_pod(POD_UID, "BestEffort", active_anon=300 * 1024 * 1024)
    container = tree.add_container(POD_UID, "BestEffort", CONTAINER_ID, active_anon=300 * 1024 * 1024)
    tree.write()

    start = 1_750_000_020.0  # event time in the past, on a minute boundary
    fake_now = [start]
    settings = AgentSettings(node_name=NODE, proc_root=str(tree.proc_root), cgroup_root=str(tree.cgroup_root))
    agent = AgentService(settings, bus, clock=lambda: fake_now[0])

    await db.run_migrations(database_url)
    engine = db.create_engine(database_url)
    store = NodeMetricStore(engine)
    registry = new_registry()
    service = NodeMetricService(bus, store, NodeMetricSettings(report_phase_step_seconds=0), registry=registry)
    await service.start()
    try:
        # 125 s of node life: the node burns 1.5 cores (100 ticks/s = 1 core), the BE pod 0.5 of them.
        for _ in range(126):
            await agent.collect_once()
            fake_now[0] += 1.0
            tree.proc.user += 150
            tree.proc.idle += 250
            pod.cpu_ns += 500_000_000
            container.cpu_ns += 500_000_000
            tree.write()

        async def reported_twice() -> bool:
            record = await store.get(NODE)
            seen = await store.nodes_by_name([NODE])
            return record is not None and record.report_time == start + 120 and seen[0].last_seen == start + 120

        await eventually(reported_twice)

        api_settings = ApiSettings(stale_after_seconds=180)
        app = create_app(
            ApiContext(
                settings=api_settings,
                components=(nodemetric_component.reads(store),),
                registry=registry,
                tokens=api_auth.token_store(),
            )
        )
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), headers=api_auth.headers(), base_url="http://t"
        ) as client:
            one = (await client.get(f"/api/v1/nodemetrics/{NODE}")).json()
            listed = (await client.get("/api/v1/nodemetrics")).json()
            missing = await client.get("/api/v1/nodemetrics/nope")
            metrics = (await client.get("/metrics")).text
    finally:
        await service.stop()
        await engine.dispose()

    assert_valid_nodemetric(one)
    # Both reports were projected, and each one's publish → projection latency was recorded.
    assert "koordbus_nodemetric_projection_latency_seconds_count 2.0" in metrics
    assert listed["items"] == [one]
    assert missing.status_code == 404 and "nope" in missing.json()["error"]
    assert one["metadata"]["name"] == NODE
    status = one["status"]
    assert status["updateTime"] == "2025-06-15T15:09:00Z"
    assert status["nodeMetric"]["nodeUsage"]["resources"]["cpu"] == "1500m"
    (pod_metric,) = status["podsMetric"]
    assert pod_metric["podUsage"]["resources"] == {"cpu": "500m", "memory": "300Mi"}
    assert (pod_metric["qos"], pod_metric["priority"]) == ("BE", "koord-batch")
    # The 5-minute aggregate has 2 minutes of samples: under the 50% span rule it is empty.
    five_minutes = status["nodeMetric"]["aggregatedNodeUsages"][0]
    assert five_minutes["duration"] == "5m0s"
    assert all(not usage.get("resources") for usage in five_minutes["usage"].values())
    # Event time is far in the past, so the node is shown stale, not dropped.
    assert one["metadata"]["annotations"]["koordbus.io/stale"] == "true"


async def _dump(database_url: str) -> list[tuple[object, ...]]:
    engine = db.create_engine(database_url)
    try:
        async with engine.connect() as conn:
            rows = await conn.execute(
                text(
                    "SELECT node, report_time, update_time, spec, status, samples_in_window"
                    " FROM node_metrics ORDER BY node"
                )
            )
            return [tuple(r) for r in rows]
    finally:
        await engine.dispose()


async def _run_until_projected(bus: JetStreamBus, database_url: str) -> None:
    """Run a service until its ingest has nothing left and every computed report is projected."""
    engine = db.create_engine(database_url)
    service = NodeMetricService(bus, NodeMetricStore(engine), NodeMetricSettings(), registry=new_registry())
    await service.start()
    try:
        _projector, ingest = service.consumers
        assert await ingest.wait_idle(60)
        _, last_computed = await bus.stream_info(streams.KOORD_NODEMETRIC)

        async def projected() -> bool:
            return await NodeMetricStore(engine).offset("nodemetric-projector") >= last_computed

        await eventually(projected, timeout=60)
    finally:
        await service.stop()
        await engine.dispose()


async def test_killed_and_restarted_service_projects_what_a_clean_replay_does(
    tmp_path: Path, koordbus_bus: JetStreamBus
) -> None:
    bus = koordbus_bus
    nodes = simulation.make_nodes(4, pods_per_node=10)
    current = (time.time() // 60) * 60
    start = current - 20 * 60
    window = start
    while window < current:
        await simulation.publish_window(bus, nodes, window, window + 10)
        window += 10

    live = f"sqlite:///{tmp_path / 'live.db'}"
    await db.run_migrations(live)
    engine = db.create_engine(live)
    first = NodeMetricService(
        bus, NodeMetricStore(engine), NodeMetricSettings(ingest_batch_size=16), registry=new_registry()
    )
    await first.start()

    async def some_progress() -> bool:
        return await NodeMetricStore(engine).offset("nodemetric-projector") >= 10

    await eventually(some_progress)
    await first.stop()  # killed mid-stream: most of the reports are not computed yet
    await engine.dispose()
    await _run_until_projected(bus, live)

    clean = f"sqlite:///{tmp_path / 'clean.db'}"
    await db.run_migrations(clean)
    await _run_until_projected(bus, clean)

    # Every round of every node was reported exactly once (restarts and replays deduplicate by Nats-Msg-Id).
    reports, _ = await bus.stream_info(streams.KOORD_NODEMETRIC)
    assert reports == 4 * 20
    live_rows, clean_rows = await _dump(live), await _dump(clean)
    assert len(live_rows) == 4
    assert live_rows == clean_rows
