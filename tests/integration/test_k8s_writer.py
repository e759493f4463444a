"""services.k8s writing half against the fake API server (tests/fakes/kube_api.py) and a real nats-server.

Decisions are published on their real subjects; what is checked is what the API server ends up holding and which
requests it was sent (`kube_api.requests`), or what record-only mode recorded.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient

from bus import subjects
from bus.api import msg_id
from bus.jetstream import JetStreamBus
from schemas import koordinator, kube, vocab
from schemas.cluster import NodeObserved
from schemas.node import HostApplicationMetric, MetricCollectPolicy, NodeMetricComputed, ResourceMap
from schemas.noderesource import ColocationConfigStatus, NodeResourceComputed
from services.common.metrics import new_registry, render
from services.k8s import writes
from services.k8s.settings import K8sSettings
from services.k8s.sinks import KubeSink, RecordingSink, WriteSink
from services.k8s.writer import ClusterWriter
from tests.fakes.kube_api import FakeKubeApi
from tests.support.crd import assert_valid_nodemetric
from tests.unit.test_noderesource_state import T0, metric_event

GI = 1024**3
ORIGIN = koordinator.ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE
ORIGIN_VALUE = '{"resources":{"kubernetes.io/batch-cpu":"25k","kubernetes.io/batch-memory":"146Gi"}}'
SETTINGS = K8sSettings(
    backoff_initial_seconds=0.05,
    backoff_max_seconds=0.2,
    nodemetric_status_interval_seconds=0.0,
    unhealthy_after_write_failures=3,
    write_timeout_seconds=5.0,
)
RESOURCES: dict[str, int | None] = {vocab.BATCH_CPU: 25000, vocab.BATCH_MEMORY: 146 * GI, vocab.MID_CPU: None}

StartWriter = Callable[..., Any]


def decision(
    node: str = "n1", *, at: float = T0, due: bool = True, resources: dict[str, int | None] | None = None
) -> NodeResourceComputed:
    return NodeResourceComputed(
        node=node,
        computed_at=at,
        trigger=("nodemetric",),
        outcome="computed",
        resources=RESOURCES if resources is None else resources,
        annotations={ORIGIN: ORIGIN_VALUE},
        write_due=due,
        write_reason="first write" if due else "up to date",
    )


def kube_node(name: str = "n1", **extra: str) -> dict[str, Any]:
    lists = {"cpu": "100", "memory": "400Gi", **extra}
    return {"metadata": {"name": name}, "status": {"capacity": dict(lists), "allocatable": dict(lists)}}


async def publish(bus: JetStreamBus, event: NodeMetricComputed | NodeResourceComputed) -> None:
    if isinstance(event, NodeMetricComputed):
        subject = subjects.nodemetric_computed(event.node)
    else:
        subject = subjects.noderesource_computed(event.node)
    data = msgspec.json.encode(event)
    await bus.publish(subject, data, msg_id=msg_id(subject, data))


async def eventually(check: Callable[[], bool], *, timeout: float = 10.0) -> None:
    async with asyncio.timeout(timeout):
        while True:
            if check():
                return
            await asyncio.sleep(0.02)


def requests(kube_api: FakeKubeApi, verb: str, path: str) -> int:
    return sum(1 for r in kube_api.requests if r.verb == verb and r.path == path)


NODEMETRIC_PATH = "/apis/slo.koordinator.sh/v1alpha1/nodemetrics"


@pytest_asyncio.fixture
async def start_writer(koordbus_bus: JetStreamBus, kube_client: ApiClient) -> AsyncIterator[StartWriter]:
    started: list[ClusterWriter] = []

    async def start(sink: WriteSink | None = None, **overrides: Any) -> ClusterWriter:
        settings = dataclasses.replace(SETTINGS, **overrides)
        sink = sink or KubeSink(kube_client, request_timeout=settings.write_timeout_seconds)
        writer = ClusterWriter(koordbus_bus, sink, settings=settings, registry=new_registry())
        await writer.start()
        started.append(writer)
        return writer

    yield start
    for writer in started:
        await writer.stop()


async def test_a_nodemetric_is_created_valid_and_later_only_its_status_is_updated(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    writer = await start_writer()
    first = metric_event("n1", at=T0)
    await publish(koordbus_bus, first)
    await eventually(lambda: (kube_api.get("nodemetrics", "n1") or {}).get("status") is not None)
    stored = kube_api.get("nodemetrics", "n1")
    assert stored is not None
    assert stored["spec"] == {"metricCollectPolicy": koordinator.collect_policy_to_json(first.spec)}
    assert stored["status"] == koordinator.nodemetric_status_to_json(first.status, quantities=True)

    second = metric_event("n1", at=T0 + 60, system_cores=4)
    apps = [HostApplicationMetric(name="nginx", usage=ResourceMap(resources={"cpu": 250, "memory": GI}), qos="LS")]
    second = msgspec.structs.replace(second, status=msgspec.structs.replace(second.status, host_applications=apps))
    await publish(koordbus_bus, second)
    wanted = koordinator.nodemetric_status_to_json(second.status, quantities=True)
    assert wanted["hostApplicationMetric"][0]["usage"] == {"resources": {"cpu": "250m", "memory": "1Gi"}}
    await eventually(lambda: (kube_api.get("nodemetrics", "n1") or {}).get("status") == wanted)
    assert await writer.wait_idle(5)
    assert requests(kube_api, "create", NODEMETRIC_PATH) == 1
    assert requests(kube_api, "update", f"{NODEMETRIC_PATH}/n1") == 0
    assert requests(kube_api, "update", f"{NODEMETRIC_PATH}/n1/status") == 2
    assert writer.healthy()
    assert 'koordbus_k8s_writes_total{object="nodemetric",outcome="created"} 1.0' in render(writer.registry).decode()


async def test_the_rate_limit_coalesces_a_burst_of_reports(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    writer = await start_writer(nodemetric_status_interval_seconds=1.0)
    await publish(koordbus_bus, metric_event("n1", at=T0))
    await eventually(lambda: requests(kube_api, "update", f"{NODEMETRIC_PATH}/n1/status") == 1)
    for step in range(1, 6):
        await publish(koordbus_bus, metric_event("n1", at=T0 + step, system_cores=3 + step))
    last = koordinator.nodemetric_status_to_json(metric_event("n1", at=T0 + 5, system_cores=8).status, quantities=True)
    await eventually(lambda: (kube_api.get("nodemetrics", "n1") or {}).get("status") == last)
    assert await writer.wait_idle(5)
    assert requests(kube_api, "update", f"{NODEMETRIC_PATH}/n1/status") == 2


async def test_a_due_decision_writes_resources_and_annotations_and_one_not_due_writes_nothing(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    kube_api.put("nodes", kube_node("n1", **{vocab.MID_CPU: "2000"}))
    writer = await start_writer()
    await publish(koordbus_bus, decision("n1"))
    await eventually(lambda: ORIGIN in ((kube_api.get("nodes", "n1") or {})["metadata"].get("annotations") or {}))
    node = kube_api.get("nodes", "n1")
    assert node is not None
    for list_name in ("capacity", "allocatable"):
        assert node["status"][list_name] == {
            "cpu": "100",
            "memory": "400Gi",
            vocab.BATCH_CPU: "25k",
            vocab.BATCH_MEMORY: "146Gi",
        }
    assert node["metadata"]["annotations"] == {ORIGIN: ORIGIN_VALUE}
    assert [r.content_type for r in kube_api.requests if r.verb == "patch"] == ["application/merge-patch+json"] * 2

    before = len(kube_api.requests)
    await publish(koordbus_bus, decision("n1", at=T0 + 30, due=False, resources={vocab.BATCH_CPU: 26000}))
    assert await writer.wait_idle(5)
    assert kube_api.requests[before:] == []


async def test_nothing_is_written_when_the_node_already_has_the_values(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    node = kube_node("n1", **{vocab.BATCH_CPU: "25000", vocab.BATCH_MEMORY: str(146 * GI)})
    node["metadata"]["annotations"] = {ORIGIN: ORIGIN_VALUE}
    kube_api.put("nodes", node)
    writer = await start_writer()
    await publish(koordbus_bus, decision("n1"))
    await eventually(lambda: requests(kube_api, "get", "/api/v1/nodes/n1") == 1)
    assert await writer.wait_idle(5)
    assert [r.verb for r in kube_api.requests] == ["get"]


async def test_a_conflict_is_retried_from_a_fresh_read(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    kube_api.put("nodes", kube_node("n1"))
    kube_api.fail_next("patch", "nodes", status=409)
    writer = await start_writer()
    await publish(koordbus_bus, decision("n1"))
    await eventually(lambda: vocab.BATCH_CPU in (kube_api.get("nodes", "n1") or {})["status"]["allocatable"])
    assert await writer.wait_idle(5)
    assert requests(kube_api, "get", "/api/v1/nodes/n1") == 2
    assert requests(kube_api, "patch", "/api/v1/nodes/n1/status") == 2
    assert writer.healthy()


async def test_repeated_server_errors_make_the_writer_unhealthy_until_a_write_succeeds(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    kube_api.fail_next("get", "nodemetrics", status=500, times=5)
    writer = await start_writer()
    await publish(koordbus_bus, metric_event("n1", at=T0))
    await eventually(lambda: not writer.healthy())
    assert (await writer.readiness() or "").startswith("k8s writes failing")
    await eventually(lambda: writer.healthy())
    assert await writer.readiness() is None
    assert kube_api.get("nodemetrics", "n1") is not None
    assert requests(kube_api, "get", f"{NODEMETRIC_PATH}/n1") == 6


async def test_record_only_mode_records_the_same_intents_without_an_api(
    koordbus_bus: JetStreamBus, start_writer: StartWriter
) -> None:
    sink = RecordingSink(keep=10, clock=lambda: T0)
    writer = await start_writer(sink)
    event = metric_event("n1", at=T0)
    await publish(koordbus_bus, event)
    await publish(koordbus_bus, decision("n1"))
    await eventually(lambda: len(sink.log) == 2)
    assert await writer.wait_idle(5)
    exported = sink.export()
    assert exported["nodemetrics"][0]["status"] == koordinator.nodemetric_status_to_json(event.status, quantities=True)
    assert exported["nodes"][0]["status"]["capacity"] == {vocab.BATCH_CPU: "25k", vocab.BATCH_MEMORY: "146Gi"}
    assert exported["nodes"][0]["metadata"]["annotations"] == {ORIGIN: ORIGIN_VALUE}
    assert sorted((w["object"], w["action"]) for w in exported["writes"]) == [
        ("node/n1", "updated"),
        ("nodemetric/n1", "created"),
    ]
    # the same decision again (a restart replays the last one) is recorded as nothing to write
    assert (await sink.write_node_resources(decision("n1"))).action == "unchanged"
    assert len(sink.log) == 2


async def test_a_restart_reapplies_the_latest_decision_per_node(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    kube_api.put("nodes", kube_node("n1"))
    writer = await start_writer()
    await publish(koordbus_bus, decision("n1", at=T0, resources={vocab.BATCH_CPU: 10000}))
    await publish(koordbus_bus, decision("n1", at=T0 + 30))
    await eventually(lambda: ORIGIN in ((kube_api.get("nodes", "n1") or {})["metadata"].get("annotations") or {}))
    assert await writer.wait_idle(5)
    await writer.stop()
    kube_api.put("nodes", kube_node("n1"))  # someone else reset the node meanwhile

    restarted = await start_writer()
    await eventually(lambda: vocab.BATCH_MEMORY in (kube_api.get("nodes", "n1") or {})["status"]["capacity"])
    assert await restarted.wait_idle(5)
    node = kube_api.get("nodes", "n1")
    assert node is not None
    assert node["status"]["capacity"][vocab.BATCH_CPU] == "25k"


async def test_a_rejected_write_is_counted_and_not_retried(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    kube_api.put("nodes", kube_node("n1"))
    kube_api.fail_next("patch", "nodes", status=422)
    writer = await start_writer()
    await publish(koordbus_bus, decision("n1"))
    await eventually(lambda: requests(kube_api, "patch", "/api/v1/nodes/n1/status") == 1)
    assert await writer.wait_idle(5)
    assert requests(kube_api, "patch", "/api/v1/nodes/n1/status") == 1
    assert 'koordbus_k8s_writes_total{object="node",outcome="rejected"} 1.0' in render(writer.registry).decode()


# --- the NodeMetric spec owned by decisions, and the colocation ConfigMap's Events

CUSTOM_SPEC = MetricCollectPolicy(aggregate_duration_seconds=120, report_interval_seconds=30)


def with_spec(base: NodeResourceComputed, spec: MetricCollectPolicy | None) -> NodeResourceComputed:
    return msgspec.structs.replace(base, nodemetric_spec=spec)


async def publish_config_status(bus: JetStreamBus, status: ColocationConfigStatus) -> None:
    data = msgspec.json.encode(status)
    await bus.publish(subjects.NODERESOURCE_CONFIG_STATUS, data, msg_id=msg_id("status", data))


async def test_a_decision_not_due_still_creates_the_nodemetric_with_its_spec_and_status_writes_keep_it(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    writer = await start_writer()
    await publish(koordbus_bus, with_spec(decision("n1", due=False), CUSTOM_SPEC))
    custom = {"metricCollectPolicy": koordinator.collect_policy_to_json(CUSTOM_SPEC)}
    await eventually(lambda: (kube_api.get("nodemetrics", "n1") or {}).get("spec") == custom)
    assert "status" not in (kube_api.get("nodemetrics", "n1") or {})
    assert kube_api.get("nodes", "n1") is None  # no node write was due (and there is no node)

    await publish(koordbus_bus, metric_event("n1", at=T0))  # carries the default spec
    await eventually(lambda: "status" in (kube_api.get("nodemetrics", "n1") or {}))
    assert (kube_api.get("nodemetrics", "n1") or {})["spec"] == custom
    # The same spec again is not even read; a decision without spec (config in error) changes nothing either.
    assert await writer.wait_idle(5)
    reads = requests(kube_api, "get", f"{NODEMETRIC_PATH}/n1")
    await publish(koordbus_bus, with_spec(decision("n1", at=T0 + 10, due=False), CUSTOM_SPEC))
    await publish(koordbus_bus, with_spec(decision("n1", at=T0 + 20, due=False), None))
    assert await writer.wait_idle(5)
    assert requests(kube_api, "get", f"{NODEMETRIC_PATH}/n1") == reads
    # A new spec is an update of the spec only.
    await publish(koordbus_bus, with_spec(decision("n1", at=T0 + 30, due=False), MetricCollectPolicy()))
    default = {"metricCollectPolicy": koordinator.collect_policy_to_json(MetricCollectPolicy())}
    await eventually(lambda: (kube_api.get("nodemetrics", "n1") or {}).get("spec") == default)
    assert await writer.wait_idle(5)
    assert "status" in (kube_api.get("nodemetrics", "n1") or {})
    assert requests(kube_api, "create", NODEMETRIC_PATH) == 1
    assert requests(kube_api, "update", f"{NODEMETRIC_PATH}/n1") == 1


async def test_a_status_write_for_a_node_without_nodemetric_uses_the_last_decided_spec(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    writer = await start_writer()
    await publish(koordbus_bus, with_spec(decision("n1", due=False), CUSTOM_SPEC))
    await eventually(lambda: kube_api.get("nodemetrics", "n1") is not None)
    assert await writer.wait_idle(5)
    kube_api.remove("nodemetrics", "n1")  # deleted behind our back: the next report re-creates it
    await publish(koordbus_bus, metric_event("n1", at=T0))
    await eventually(lambda: "status" in (kube_api.get("nodemetrics", "n1") or {}))
    stored = kube_api.get("nodemetrics", "n1")
    assert stored is not None
    assert stored["spec"] == {"metricCollectPolicy": koordinator.collect_policy_to_json(CUSTOM_SPEC)}
    assert_valid_nodemetric(stored)


async def test_each_distinct_config_error_is_one_warning_event_and_a_recovery_a_normal_one(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    writer = await start_writer()
    await publish_config_status(koordbus_bus, ColocationConfigStatus(error=None, resource_version="1", at=T0))
    bad = ColocationConfigStatus(error="invalid colocation-config: $.enable", resource_version="2", at=T0 + 1)
    await publish_config_status(koordbus_bus, bad)
    await eventually(lambda: len(kube_api.objects("events")) == 1)
    # The same status republished (a service restart) is the same Event: AlreadyExists, not a second one.
    await publish_config_status(koordbus_bus, msgspec.structs.replace(bad, at=T0 + 5))
    assert await writer.wait_idle(5)
    assert len(kube_api.objects("events")) == 1
    assert requests(kube_api, "create", "/api/v1/namespaces/koordinator-system/events") == 2
    worse = ColocationConfigStatus(error="worse", previous_error=bad.error, resource_version="3", at=T0 + 6)
    fixed = ColocationConfigStatus(error=None, previous_error="worse", resource_version="4", at=T0 + 7)
    await publish_config_status(koordbus_bus, worse)
    await publish_config_status(koordbus_bus, fixed)
    await eventually(lambda: len(kube_api.objects("events")) == 3)
    assert await writer.wait_idle(5)
    stored = kube_api.objects("events")
    assert sorted((e["type"], e["message"]) for e in stored if e["type"] == "Warning") == [
        ("Warning", bad.error),
        ("Warning", "worse"),
    ]
    assert [e["reason"] for e in stored if e["type"] == "Normal"] == [writes.EVENT_REASON_RECOVERED]
    assert 'koordbus_k8s_writes_total{object="event",outcome="created"} 3.0' in render(writer.registry).decode()


async def test_record_only_mode_records_specs_and_events(koordbus_bus: JetStreamBus, start_writer: StartWriter) -> None:
    sink = RecordingSink(keep=10, clock=lambda: T0)
    writer = await start_writer(sink)
    await publish(koordbus_bus, with_spec(decision("n1", due=False), CUSTOM_SPEC))
    await publish_config_status(koordbus_bus, ColocationConfigStatus(error="bad", resource_version="2", at=T0))
    await eventually(lambda: len(sink.log) == 2)
    assert await writer.wait_idle(5)
    exported = sink.export()
    assert exported["nodemetrics"][0]["spec"] == {
        "metricCollectPolicy": koordinator.collect_policy_to_json(CUSTOM_SPEC)
    }
    assert [(e["type"], e["message"]) for e in exported["events"]] == [("Warning", "bad")]
    assert sorted((w["object"], w["action"]) for w in exported["writes"])[1] == ("nodemetric/n1", "created")


async def publish_node(bus: JetStreamBus, name: str, *, deleted: bool, rv: str) -> None:
    node = None if deleted else msgspec.convert(kube_node(name), kube.Node)
    observed = NodeObserved(name=name, observed_at=T0, resource_version=rv, deleted=deleted, node=node)
    data = msgspec.json.encode(observed)
    await bus.publish(subjects.cluster_node(name), data, msg_id=msg_id(subjects.cluster_node(name), data))


async def test_a_node_tombstone_deletes_its_nodemetric_until_the_node_returns(
    koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, start_writer: StartWriter
) -> None:
    writer = await start_writer()
    await publish_node(koordbus_bus, "n1", deleted=False, rv="1")
    await publish(koordbus_bus, with_spec(decision("n1", due=False), CUSTOM_SPEC))
    await eventually(lambda: kube_api.get("nodemetrics", "n1") is not None)
    await publish_node(koordbus_bus, "n1", deleted=True, rv="2")
    await eventually(lambda: kube_api.get("nodemetrics", "n1") is None)
    # Neither a late report nor a (replayed) decision brings it back while the node is gone.
    await publish(koordbus_bus, metric_event("n1", at=T0 + 60))
    await publish(koordbus_bus, with_spec(decision("n1", at=T0 + 60, due=False), MetricCollectPolicy()))
    assert await writer.wait_idle(5)
    assert kube_api.get("nodemetrics", "n1") is None
    assert 'koordbus_k8s_writes_total{object="nodemetric",outcome="deleted"} 1.0' in render(writer.registry).decode()
    # The node's return writes the latest decided spec again.
    await publish_node(koordbus_bus, "n1", deleted=False, rv="3")
    default = {"metricCollectPolicy": koordinator.collect_policy_to_json(MetricCollectPolicy())}
    await eventually(lambda: (kube_api.get("nodemetrics", "n1") or {}).get("spec") == default)
    # A restart replays the current node (not the tombstone): nothing is deleted.
    assert await writer.wait_idle(5)
    await writer.stop()
    restarted = await start_writer()
    assert await restarted.wait_idle(5)
    assert kube_api.get("nodemetrics", "n1") is not None
    assert requests(kube_api, "delete", f"{NODEMETRIC_PATH}/n1") == 1
