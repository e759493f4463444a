"""services.slo.service on a real nats-server: cluster events in, NodeSLO specs in the KOORD_SLO key-value bucket
out — only after the start-up replay, once per change, nothing again after a restart, a delete marker for a gone
node, and the ConfigMap's errors on the bucket's `_config` key."""

from __future__ import annotations

import json

import httpx
import msgspec
import nats
from prometheus_client import CollectorRegistry

from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas.cluster import NodeObserved
from schemas.qos import NODE_SLO_DECODER, SLO_CONFIG_STATUS_DECODER, ActuationApplied, Change, NodeSloRendered
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth
from services.common.kv import is_delete_marker
from services.common.metrics import new_registry
from services.slo import component as slo_component
from services.slo.service import SloService
from tests.support import api_auth
from tests.support.events import publish_events
from tests.support.waiting import eventually
from tests.unit.test_slo_core import T0, THRESHOLD, _configmap, _node


async def _value(bus: JetStreamBus, node: str) -> NodeSloRendered | None:
    stored = await bus.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(node))
    if stored is None or is_delete_marker(stored):
        return None
    return NODE_SLO_DECODER.decode(stored.data)


async def _revisions(bus: JetStreamBus) -> int:
    return (await bus.stream_info(streams.KV_KOORD_SLO))[1]


async def _start(bus: JetStreamBus) -> SloService:
    service = SloService(bus, registry=CollectorRegistry(), clock=lambda: T0 + 5)
    await service.start()
    return service


async def test_specs_reach_the_bucket_after_the_replay_and_follow_changes(koordbus_bus: JetStreamBus) -> None:
    bus = koordbus_bus
    # The ConfigMap arrives (in stream order) after the nodes: the replay must not publish the defaults first.
    await publish_events(bus, _node("online"), _node("batch.pool-1", {"pool": "batch"}))
    await publish_events(bus, _configmap({"resource-threshold-config": THRESHOLD}))
    service = await _start(bus)
    try:
        batch = await _value(bus, "batch.pool-1")
        online = await _value(bus, "online")
        assert batch is not None and online is not None
        assert batch.spec["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 50
        assert online.spec["resourceUsedThresholdWithBE"]["enable"] is True
        assert await _revisions(bus) == 2  # one put per node, none with the defaults

        changed = THRESHOLD.replace("50", "40")
        await publish_events(bus, _configmap({"resource-threshold-config": changed}))

        async def batch_moved() -> bool:
            value = await _value(bus, "batch.pool-1")
            return value is not None and value.spec["resourceUsedThresholdWithBE"]["cpuSuppressThresholdPercent"] == 40

        await eventually(batch_moved)
        assert await _revisions(bus) == 3  # the online node's spec did not change: not put again

        # A bad key: the last good value stays, the error goes to `_config`.
        bad = json.dumps({"clusterStrategy": {"cpuBurstPercent": -5}})
        await publish_events(bus, _configmap({"resource-threshold-config": changed, "cpu-burst-config": bad}))

        async def status_written() -> bool:
            stored = await bus.last_on_subject(streams.KV_KOORD_SLO, subjects.SLO_CONFIG_STATUS)
            return stored is not None and bool(SLO_CONFIG_STATUS_DECODER.decode(stored.data).errors)

        await eventually(status_written)
        stored = await bus.last_on_subject(streams.KV_KOORD_SLO, subjects.SLO_CONFIG_STATUS)
        assert stored is not None
        errors = SLO_CONFIG_STATUS_DECODER.decode(stored.data).errors
        assert errors == {"cpu-burst-config": "$.clusterStrategy.cpuBurstPercent: -5 is out of range [0, 10000]"}
        batch = await _value(bus, "batch.pool-1")
        assert batch is not None and batch.spec["cpuBurstStrategy"]["cpuBurstPercent"] == 1000  # the default stays

        # The node goes: its key gets a delete marker.
        await publish_events(bus, NodeObserved(name="online", observed_at=T0 + 9, deleted=True))

        async def online_deleted() -> bool:
            return await _value(bus, "online") is None

        await eventually(online_deleted)
    finally:
        await service.stop()

    # A restart renders the same specs: nothing new is put.
    before = await _revisions(bus)
    service = await _start(bus)
    await service.stop()
    assert await _revisions(bus) == before


def _api(bus: JetStreamBus | None) -> httpx.AsyncClient:
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        components=(slo_component.reads(bus),),
        tokens=api_auth.token_store(),
    )
    transport = httpx.ASGITransport(app=create_app(context), raise_app_exceptions=False)
    return httpx.AsyncClient(transport=transport, base_url="http://api", headers=api_auth.headers(auth.VIEWER))


async def test_the_api_serves_a_nodes_slo_and_its_recent_actuations(koordbus_bus: JetStreamBus) -> None:
    bus = koordbus_bus
    bad = json.dumps({"clusterStrategy": {"cpuBurstPercent": -5}})
    await publish_events(
        bus, _node("n1"), _configmap({"resource-threshold-config": THRESHOLD, "cpu-burst-config": bad})
    )
    service = await _start(bus)
    await service.stop()
    change = Change(path="cpu/kubepods/besteffort/podx/cpu.shares", before="1024", after="2048", reason="BE shares")
    for i in range(3):
        event = ActuationApplied(node="n1", loop="be-cgroup", at=T0 + i, dry_run=False, changes=[change])
        await bus.publish(subjects.node_actuation("n1"), msgspec.json.encode(event), msg_id=f"act-{i}")
    await bus.publish(subjects.node_actuation("n1"), b"{not json", msg_id="act-broken")
    async with _api(bus) as api:
        slo = await api.get("/api/v1/nodes/n1/slo")
        assert slo.status_code == 200, slo.text
        body = slo.json()
        assert body["spec"]["resourceUsedThresholdWithBE"]["enable"] is True
        assert body["configErrors"] == {
            "cpu-burst-config": "$.clusterStrategy.cpuBurstPercent: -5 is out of range [0, 10000]"
        }
        assert body["revision"] >= 1 and body["renderedAt"] == T0 + 5
        missing = await api.get("/api/v1/nodes/nope/slo")
        assert missing.status_code == 404 and "nope" in missing.json()["error"]

        acts = await api.get("/api/v1/nodes/n1/actuations", params={"since": 0, "limit": 2})
        assert acts.status_code == 200, acts.text
        listed = acts.json()["actuations"]
        assert [a["at"] for a in listed] == [T0 + 2]  # the newest two: one event and the unreadable one (skipped)
        assert listed[0]["changes"][0]["after"] == "2048" and listed[0]["seq"] > 0
        none = await api.get("/api/v1/nodes/n2/actuations", params={"since": 0})
        assert none.status_code == 200 and none.json()["actuations"] == []
        assert (await api.get("/api/v1/nodes/n1/actuations", params={"limit": 0})).status_code == 422
    async with _api(None) as api:
        assert (await api.get("/api/v1/nodes/n1/slo")).status_code == 503


async def test_the_bucket_is_a_jetstream_key_value_bucket(koordbus_nats_url: str, koordbus_bus: JetStreamBus) -> None:
    """What `nats kv get KOORD_SLO <node>` reads: the same value, through nats-py's own KeyValue API."""
    await publish_events(koordbus_bus, _node("node-a.example"))
    service = await _start(koordbus_bus)
    await service.stop()
    nc = await nats.connect(koordbus_nats_url)
    try:
        kv = await nc.jetstream().key_value(subjects.SLO_BUCKET)
        entry = await kv.get(subjects.encode_token("node-a.example"))
        assert entry.value is not None
        assert NODE_SLO_DECODER.decode(entry.value).node == "node-a.example"
        assert await kv.keys() == [subjects.encode_token("node-a.example")]
    finally:
        await nc.close()
