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
from schemas import koordinator, vocab
from schemas.node import NodeMetricComputed
from schemas.noderesource import NodeResourceComputed
from services.common.metrics import new_registry, render
from services.k8s.settings import K8sSettings
from services.k8s.writer import ClusterWriter, KubeSink, RecordingSink, WriteSink
from tests.fakes.kube_api import FakeKubeApi
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
    await publish(koordbus_bus, second)
    wanted = koordinator.nodemetric_status_to_json(second.status, quantities=True)
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
