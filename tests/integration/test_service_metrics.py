"""Each service's metrics move with real events on a real nats-server: consumer handling histograms and lag (per
consumer, every service), decisions by reason (noderesource, quota, migration) and writes to Kubernetes by kind
and outcome (the k8s writer, the NodeSLO mirror, the eviction executor). Values are read from the rendered
/metrics text, as Prometheus sees them."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import httpx
import msgspec
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bus import subjects
from bus.jetstream import JetStreamBus
from schemas import migration
from schemas.node import encode_node_event
from schemas.qos import PodEvictionRequested
from schemas.quota_service import CheckReply, CheckRequest
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common import auth, db
from services.common.metrics import new_registry, render
from services.k8s.eviction_executor import EvictionExecutor, RecordingEvictor
from services.k8s.nodeslo_mirror import NodeSloMirror, RecordingNodeSloSink
from services.k8s.sinks import RecordingSink
from services.k8s.writer import NODERESOURCE_CONSUMER, ClusterWriter
from services.migration.service import MigrationService
from services.nodemetric.service import INGEST_CONSUMER, NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore
from services.noderesource.service import CLUSTER_CONSUMER as NODERESOURCE_CLUSTER
from services.noderesource.service import NodeResourceService
from services.noderesource.settings import NodeResourceSettings
from services.quota.service import QuotaService
from services.slo import component as slo_component
from services.slo.service import CLUSTER_CONSUMER as SLO_CLUSTER
from services.slo.service import SloService
from tests.integration import test_migration_service as migration_support
from tests.integration import test_quota_service as quota_support
from tests.integration.test_dead_letters import batch
from tests.integration.test_k8s_writer import SETTINGS as K8S_SETTINGS
from tests.integration.test_k8s_writer import decision
from tests.integration.test_k8s_writer import publish as publish_decision
from tests.integration.test_noderesource_service import Clock, worked_example
from tests.support import api_auth
from tests.support.events import publish_events
from tests.support.migration import job
from tests.support.waiting import eventually
from tests.unit.test_noderesource_state import T0, config_event
from tests.unit.test_slo_core import _node


def exported(registry: CollectorRegistry, sample: str, **labels: str) -> float:
    """The value of `sample` with these labels in the rendered text (0 when absent)."""
    for family in text_string_to_metric_families(render(registry).decode()):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


def handled(registry: CollectorRegistry, consumer: str) -> tuple[float, float]:
    """(delivery-to-ack observations, event-age observations) of `consumer`."""
    return (
        exported(registry, "koordbus_consumer_handle_seconds_count", consumer=consumer),
        exported(registry, "koordbus_consumer_event_age_seconds_count", consumer=consumer),
    )


async def test_noderesource_counts_decisions_by_outcome_and_reason(koordbus_bus: JetStreamBus) -> None:
    await worked_example(koordbus_bus)
    registry = new_registry()
    service = NodeResourceService(
        koordbus_bus, NodeResourceSettings(startup_timeout_seconds=10), registry=registry, clock=Clock(T0 + 30)
    )
    await service.start()
    try:
        computed = {"outcome": "computed", "reason": "none"}
        assert exported(registry, "koordbus_noderesource_decisions_total", **computed) == 1
        acked, aged = handled(registry, NODERESOURCE_CLUSTER)
        assert acked >= 5 and aged >= 5  # the config, the node and its three pods
        assert exported(registry, "koordbus_consumer_pending_messages", consumer=NODERESOURCE_CLUSTER) == 0

        await publish_events(koordbus_bus, config_event({"enable": False}, rv="2"))
        disabled = {"outcome": "disabled", "reason": "DisableInConfig"}
        await eventually(lambda: exported(registry, "koordbus_noderesource_decisions_total", **disabled) == 1)
        await eventually(lambda: handled(registry, NODERESOURCE_CLUSTER) == (acked + 1, aged + 1))  # acked after
    finally:
        await service.stop()


async def test_quota_counts_check_verdicts_by_what_decided_them(koordbus_bus: JetStreamBus) -> None:
    await quota_support.observe(koordbus_bus, quota_support.node("n1", "40"))
    registry = new_registry()
    service = QuotaService(koordbus_bus, quota_support.SETTINGS, registry=registry)
    await service.start()
    try:
        await quota_support.build_team(koordbus_bus)
        await quota_support.observe(
            koordbus_bus,
            quota_support.pod("p1", "30", quota_name="a", node_name="n1"),
            quota_support.pod("p2", "5", quota_name="b"),
        )
        # the three CreateQuota events of the log (acked after the model applied them: wait, don't race)
        await eventually(lambda: handled(registry, "quota-events")[0] == 3)

        async def p1_counted() -> bool:
            check = CheckRequest(pods=[quota_support.pod("q1", "10", quota_name="a")])
            raw = await koordbus_bus.request(subjects.QUOTA_RPC_CHECK, msgspec.json.encode(check), timeout=10)
            return not msgspec.json.decode(raw, type=CheckReply).fits

        await eventually(p1_counted)
        verdicts = "koordbus_quota_check_verdicts_total"
        before = {v: exported(registry, verdicts, verdict=v) for v in ("fits", "parent-quota")}  # the polls counted
        fitting = quota_support.pod("q2", "4", quota_name="b")
        check = CheckRequest(pods=[fitting, quota_support.pod("q3", "1", quota_name="org")])
        raw = await koordbus_bus.request(subjects.QUOTA_RPC_CHECK, msgspec.json.encode(check), timeout=10)
        assert [v["code"] for v in msgspec.json.decode(raw, type=CheckReply).verdicts] == ["fits", "parent-quota"]
        for verdict in ("fits", "parent-quota"):
            assert exported(registry, verdicts, verdict=verdict) == before[verdict] + 1
        assert exported(registry, "koordbus_quota_check_verdicts_total", verdict="over-limit") >= 1
        await eventually(lambda: handled(registry, "quota-cluster")[1] >= 3)  # the node and the pods
    finally:
        await service.stop()


async def test_migration_counts_decisions_by_outcome_and_reason(koordbus_bus: JetStreamBus) -> None:
    rs, pods = migration_support.deployment(3)
    await migration_support.observe(koordbus_bus, rs, *pods)
    broken = msgspec.structs.replace(job("broken", "x"), spec=migration.PodMigrationJobSpec())
    await migration_support.request(koordbus_bus, broken, job("fine", "web-0"))
    registry = new_registry()
    service = MigrationService(koordbus_bus, migration_support.SETTINGS, registry=registry)
    await service.start()
    try:
        await eventually(lambda: {"broken", "fine"} <= set(service.state.jobs))
        await service.run_round()
        rejected = {"outcome": "rejected", "reason": "InvalidPodRef"}
        await eventually(lambda: exported(registry, "koordbus_migration_decision_reasons_total", **rejected) == 1)
        passed = {"outcome": "passed", "reason": "none"}
        assert exported(registry, "koordbus_migration_decision_reasons_total", **passed) == 1
        acked, aged = handled(registry, "migration-events")
        assert acked >= 2 and aged >= 2  # the two requests (and the round the service appended)
    finally:
        await service.stop()


async def test_kubernetes_writes_are_counted_by_kind_and_outcome_across_writers(koordbus_bus: JetStreamBus) -> None:
    registry = new_registry()  # one registry for the whole k8s process, as `koordbus service k8s` has
    writer = ClusterWriter(koordbus_bus, RecordingSink(keep=10), settings=K8S_SETTINGS, registry=registry)
    evictor = RecordingEvictor()
    evictions = EvictionExecutor(koordbus_bus, evictor, registry=registry)
    slo = SloService(koordbus_bus, registry=registry)
    nodeslos = NodeSloMirror(koordbus_bus, RecordingNodeSloSink(), settings=K8S_SETTINGS, registry=registry)
    started = [writer, evictions, slo, nodeslos]
    for part in started:
        await part.start()
    try:
        writes = "koordbus_k8s_writes_total"
        await publish_decision(koordbus_bus, decision("n1"))
        await eventually(lambda: exported(registry, writes, object="node", outcome="updated") == 1)
        await eventually(lambda: handled(registry, NODERESOURCE_CONSUMER) == (1, 1))  # acked after the write

        request = PodEvictionRequested(
            node="n1", at=time.time(), namespace="default", name="be-0", uid="u-1", feature="BECPUEvict", reason="x"
        )
        await koordbus_bus.publish(subjects.node_eviction("n1"), msgspec.json.encode(request), msg_id="evict-1")
        await eventually(lambda: exported(registry, writes, object="eviction", outcome="evicted") == 1)
        await eventually(lambda: handled(registry, "k8s-evictions") == (1, 1))
        assert len(evictor.log) == 1

        await publish_events(koordbus_bus, _node("n2"))
        await eventually(lambda: exported(registry, writes, object="nodeslo", outcome="created") == 1)
        await eventually(
            lambda: handled(registry, SLO_CLUSTER)[0] >= 1 and handled(registry, "k8s-nodeslo-mirror")[0] >= 1
        )
    finally:
        for part in reversed(started):
            await part.stop()


async def test_nodemetric_ingest_handling_is_observed(tmp_path: Path, koordbus_bus: JetStreamBus) -> None:
    database_url = f"sqlite:///{tmp_path / 'koordbus.db'}"
    await db.run_migrations(database_url)
    engine = db.create_engine(database_url)
    registry = new_registry()
    service = NodeMetricService(
        koordbus_bus, NodeMetricStore(engine), NodeMetricSettings(report_phase_step_seconds=0), registry=registry
    )
    await service.start()
    try:
        assert handled(registry, INGEST_CONSUMER) == (0, 0)
        for k in range(3):
            data = encode_node_event(batch(k))
            await koordbus_bus.publish(subjects.node_metrics("node-x"), data, msg_id=uuid.uuid4().hex)
        await eventually(lambda: handled(registry, INGEST_CONSUMER) == (3, 3))
        assert exported(registry, "koordbus_consumer_pending_messages", consumer=INGEST_CONSUMER) == 0
    finally:
        await service.stop()
        await engine.dispose()


async def test_api_requests_are_timed_by_route_template_not_path(koordbus_bus: JetStreamBus) -> None:
    await publish_events(koordbus_bus, _node("n1"))
    slo = SloService(koordbus_bus, registry=new_registry())
    await slo.start()
    await slo.stop()
    registry = new_registry()
    context = ApiContext(
        settings=ApiSettings(),
        registry=registry,
        components=(slo_component.reads(koordbus_bus),),
        tokens=api_auth.token_store(),
    )
    transport = httpx.ASGITransport(app=create_app(context), raise_app_exceptions=False)
    async with httpx.AsyncClient(
        transport=transport, base_url="http://api", headers=api_auth.headers(auth.VIEWER)
    ) as api:
        assert (await api.get("/api/v1/nodes/n1/slo")).status_code == 200
        assert (await api.get("/api/v1/nodes/gone/slo")).status_code == 404
        assert (await api.get("/no/such/route")).status_code == 404
    route = "/api/v1/nodes/{node}/slo"
    count = "koordbus_api_request_seconds_count"
    assert exported(registry, count, method="GET", route=route, status="200") == 1
    assert exported(registry, count, method="GET", route=route, status="404") == 1
    assert exported(registry, count, method="GET", route="unmatched", status="404") == 1
    families = text_string_to_metric_families(render(registry).decode())
    routes = {sample.labels.get("route", "") for family in families for sample in family.samples}
    assert not any("n1" in r or "gone" in r for r in routes)
