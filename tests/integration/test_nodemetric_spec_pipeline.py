"""The NodeMetric spec from the colocation strategy (spec §1.3) and the Event for a bad ConfigMap, through the real
pieces in one process: services.k8s's observer watching the fake API server, the noderesource service deciding, and
the k8s writer writing back to the fake API, all over a real nats-server.

What is checked is what the API server ends up holding: one NodeMetric per node with its merged strategy's metric
collect policy (valid against the CRD), status reports that do not touch that spec, a config change that updates
it, a bad ConfigMap that keeps the spec and produces exactly one Warning Event (a redelivery after a writer
restart included), then a Normal one when the ConfigMap is fixed, and a deleted Node whose NodeMetric goes with it.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
import pytest_asyncio
from kubernetes_asyncio.client import ApiClient

from bus import subjects
from bus.api import msg_id
from bus.jetstream import JetStreamBus
from schemas import koordinator
from schemas.node import MetricCollectPolicy
from services.common.metrics import new_registry
from services.k8s import writes
from services.k8s.observer import ClusterObserver
from services.k8s.settings import K8sSettings
from services.k8s.sinks import KubeSink
from services.k8s.writer import ClusterWriter
from services.noderesource.service import NodeResourceService
from services.noderesource.settings import NodeResourceSettings
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_k8s_writer import eventually
from tests.support.crd import assert_valid_nodemetric
from tests.unit.test_noderesource_state import metric_event

SETTINGS = K8sSettings(
    watch_timeout_seconds=30,
    backoff_initial_seconds=0.05,
    backoff_max_seconds=0.2,
    nodemetric_status_interval_seconds=0.0,
)
CM_NAMESPACE, CM_NAME = SETTINGS.configmap_namespace, SETTINGS.configmap_name
BIG, PLAIN = "big-1", "plain-1"


def strategy(big_report_interval: int) -> dict[str, Any]:
    return {
        "enable": True,
        "metricAggregateDurationSeconds": 600,
        "nodeConfigs": [
            {
                "name": "big",
                "nodeSelector": {"matchLabels": {"pool": "big"}},
                "metricAggregateDurationSeconds": 120,
                "metricReportIntervalSeconds": big_report_interval,
                "metricAggregatePolicy": {"durations": ["2m", "1h"]},
            }
        ],
    }


def configmap(text: str) -> dict[str, Any]:
    return {"metadata": {"name": CM_NAME, "namespace": CM_NAMESPACE}, "data": {"colocation-config": text}}


def kube_node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    lists = {"cpu": "100", "memory": "400Gi"}
    return {"metadata": {"name": name, "labels": labels}, "status": {"capacity": lists, "allocatable": lists}}


def policy(**fields: Any) -> dict[str, Any]:
    return koordinator.collect_policy_to_json(MetricCollectPolicy(**fields))


def spec_of(kube_api: FakeKubeApi, node: str) -> dict[str, Any] | None:
    found = kube_api.get("nodemetrics", node)
    return None if found is None else found["spec"]["metricCollectPolicy"]


def events(kube_api: FakeKubeApi, event_type: str) -> list[dict[str, Any]]:
    return [e for e in kube_api.objects("events") if e["type"] == event_type]


class Clock:
    def __init__(self) -> None:
        self.now = time.time()

    def __call__(self) -> float:
        return self.now


@dataclass
class Pipeline:
    observer: ClusterObserver
    service: NodeResourceService
    writer: ClusterWriter
    clock: Clock


@pytest_asyncio.fixture
async def pipeline(
    kube_api: FakeKubeApi, kube_client: ApiClient, koordbus_bus: JetStreamBus
) -> AsyncIterator[Callable[[], Any]]:
    started: list[Any] = []

    async def start() -> Pipeline:
        clock = Clock()
        observer = ClusterObserver(koordbus_bus, kube_client, SETTINGS, registry=new_registry())
        await observer.start()
        started.append(observer)
        service = NodeResourceService(
            koordbus_bus, NodeResourceSettings(startup_timeout_seconds=10), registry=new_registry(), clock=clock
        )
        await service.start()
        started.append(service)
        writer = ClusterWriter(koordbus_bus, KubeSink(kube_client), settings=SETTINGS, registry=new_registry())
        await writer.start()
        started.append(writer)
        return Pipeline(observer=observer, service=service, writer=writer, clock=clock)

    yield start
    for piece in reversed(started):
        await piece.stop()


async def test_nodemetric_specs_follow_the_strategy_and_a_bad_configmap_is_one_warning_event(
    kube_api: FakeKubeApi, koordbus_bus: JetStreamBus, kube_client: ApiClient, pipeline: Callable[[], Any]
) -> None:
    kube_api.put("nodes", kube_node(BIG, {"pool": "big"}))
    kube_api.put("nodes", kube_node(PLAIN, {}))
    kube_api.put("configmaps", configmap(json.dumps(strategy(big_report_interval=30))))
    running: Pipeline = await pipeline()

    # One NodeMetric per node, created with its merged strategy's policy, before any koordlet report.
    big_spec = policy(aggregate_duration_seconds=120, report_interval_seconds=30, durations_seconds=(120, 3600))
    plain_spec = policy(aggregate_duration_seconds=600)
    await eventually(lambda: spec_of(kube_api, BIG) == big_spec and spec_of(kube_api, PLAIN) == plain_spec)
    for node in (BIG, PLAIN):
        stored = kube_api.get("nodemetrics", node)
        assert stored is not None and "status" not in stored
        assert_valid_nodemetric(stored)

    # A status report carrying the default spec writes the status and leaves the decided spec alone.
    report = metric_event(BIG, at=running.clock.now)
    assert koordinator.collect_policy_to_json(report.spec) != big_spec
    data = msgspec.json.encode(report)
    subject = subjects.nodemetric_computed(BIG)
    await koordbus_bus.publish(subject, data, msg_id=msg_id(subject, data))

    def reported() -> bool:
        found = kube_api.get("nodemetrics", BIG)
        return found is not None and "status" in found

    await eventually(reported)
    assert spec_of(kube_api, BIG) == big_spec

    # A config change updates the spec of the node it concerns (status kept).
    kube_api.put("configmaps", configmap(json.dumps(strategy(big_report_interval=45))))
    changed_spec = {**big_spec, "reportIntervalSeconds": 45}
    await eventually(lambda: spec_of(kube_api, BIG) == changed_spec)
    stored = kube_api.get("nodemetrics", BIG)
    assert stored is not None and "status" in stored
    assert_valid_nodemetric(stored)
    assert spec_of(kube_api, PLAIN) == plain_spec
    assert kube_api.objects("events") == []  # nothing to tell while the config is good

    # A bad ConfigMap: one Warning Event on it, and the specs stay as they were.
    kube_api.put("configmaps", configmap(json.dumps({**strategy(big_report_interval=45), "enable": "yes"})))
    await eventually(lambda: len(events(kube_api, "Warning")) == 1)
    warning = events(kube_api, "Warning")[0]
    assert warning["reason"] == writes.EVENT_REASON_INVALID
    assert warning["involvedObject"]["kind"] == "ConfigMap"
    assert (warning["involvedObject"]["namespace"], warning["involvedObject"]["name"]) == (CM_NAMESPACE, CM_NAME)
    assert warning["metadata"]["namespace"] == CM_NAMESPACE
    assert "$.enable" in warning["message"]
    # Every node decided again while the config is in error: the decisions carry no spec, nothing changes.
    running.clock.now += 120
    await running.service.resync()
    decision = running.service.last_decision(BIG)
    assert decision is not None and decision.nodemetric_spec is None
    assert await running.writer.wait_idle(10)
    assert spec_of(kube_api, BIG) == changed_spec and spec_of(kube_api, PLAIN) == plain_spec
    # A restarted writer is given the last status again: the Event already exists, so still exactly one.
    await running.writer.stop()
    restarted = ClusterWriter(koordbus_bus, KubeSink(kube_client), settings=SETTINGS, registry=new_registry())
    await restarted.start()
    try:
        assert await restarted.wait_idle(10)
        assert len(events(kube_api, "Warning")) == 1
        assert events(kube_api, "Normal") == []

        # Fixed again: a Normal Event, and the specs follow the new content.
        kube_api.put("configmaps", configmap(json.dumps(strategy(big_report_interval=60))))
        await eventually(lambda: len(events(kube_api, "Normal")) == 1)
        assert events(kube_api, "Normal")[0]["reason"] == writes.EVENT_REASON_RECOVERED
        await eventually(lambda: spec_of(kube_api, BIG) == {**big_spec, "reportIntervalSeconds": 60})
        assert len(events(kube_api, "Warning")) == 1

        # A deleted Node takes its NodeMetric along; a late report does not bring it back, the Node's return does.
        kube_api.remove("nodes", PLAIN)
        await eventually(lambda: kube_api.get("nodemetrics", PLAIN) is None)
        late = metric_event(PLAIN, at=running.clock.now + 60)
        data = msgspec.json.encode(late)
        subject = subjects.nodemetric_computed(PLAIN)
        await koordbus_bus.publish(subject, data, msg_id=msg_id(subject, data))
        assert await restarted.wait_idle(10)
        assert kube_api.get("nodemetrics", PLAIN) is None
        assert kube_api.get("nodemetrics", BIG) is not None
        kube_api.put("nodes", kube_node(PLAIN, {}))
        await eventually(lambda: spec_of(kube_api, PLAIN) == plain_spec)
    finally:
        await restarted.stop()
