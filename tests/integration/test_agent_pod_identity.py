"""Pod identity through the real path: the agent's batch builder on a generated cgroup tree, joined with a
kubelet-shaped pod list served over HTTP, → nats-server → the nodemetric service (podsMetric) → the noderesource
calculation (batch allocatable, spec §2.4).

On a real node the agent measures pods by cgroup, i.e. by UID; the cluster matches podsMetric to pods by
namespace/name. Unless the agent names its pods as the kubelet lists them, no metric matches a pod: each high-priority
pod's request is added and each metric dangles (its usage added again), and batch pods measured under a Burstable
cgroup count as high priority.
"""

from __future__ import annotations

import json
from pathlib import Path

import msgspec

from agent.pods import KubeletPods
from agent.service import AgentService
from agent.settings import AgentSettings
from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas import kube, vocab
from schemas.cluster import NodeObserved, PodObserved
from schemas.node import NODE_EVENT_DECODER, NodeMetricComputed, NodeMetricsReported
from services.common import db
from services.common.metrics import new_registry
from services.nodemetric.service import NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore
from services.noderesource import core
from tests.cgroup_tree import FakeCgroupTree
from tests.integration.test_agent_collect import FlakyPublisher
from tests.integration.test_agent_port import Kubelet
from tests.integration.test_noderesource_service import Clock, latest, service
from tests.support.events import publish_events as publish
from tests.support.waiting import eventually
from tests.unit.test_noderesource_state import config_event

NODE = "node-a"
WEB_UID = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
SPARK_UID = "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"
GONE_UID = "2b3c4d5e-6f70-4b9c-8d1e-2f3a4b5c6d7e"
MiB = 1024**2
GiB = 1024**3
BATCH_CPU, BATCH_MEMORY = core.BATCH_RESOURCES


def listed_pod(uid: str, namespace: str, name: str, *, requests: dict[str, str], **meta: object) -> dict[str, object]:
    """A pod as the kubelet's /pods lists it (and as the API server has it: the bridge's PodObserved)."""
    return {
        "metadata": {"uid": uid, "namespace": namespace, "name": name, **meta},
        "spec": {"nodeName": NODE, "containers": [{"name": "main", "resources": {"requests": requests}}]},
        "status": {"phase": "Running", "qosClass": "Burstable"},
    }


WEB = listed_pod(WEB_UID, "shop", "web-0", requests={"cpu": "2", "memory": "4Gi"}, labels={"app": "web"})
SPARK = listed_pod(
    SPARK_UID,
    "jobs",
    "spark-exec-1",
    requests={"cpu": "1", "memory": "1Gi"},
    labels={vocab.PRIORITY_CLASS_LABEL: "koord-batch", vocab.QOS_CLASS_LABEL: "BE"},
)
GONE = listed_pod(GONE_UID, "shop", "no-cgroup", requests={"cpu": "1", "memory": "1Gi"})


def observed(pod: dict[str, object], at: float) -> PodObserved:
    obj = msgspec.convert(pod, kube.Pod)
    return PodObserved(
        namespace=obj.metadata.namespace,
        name=obj.metadata.name,
        observed_at=at,
        node_name=NODE,
        resource_version="1",
        pod=obj,
    )


def node_observed(at: float) -> NodeObserved:
    resources = {"cpu": "8", "memory": "16Gi"}
    node = msgspec.convert(
        {"metadata": {"name": NODE}, "status": {"capacity": resources, "allocatable": resources}}, kube.Node
    )
    return NodeObserved(name=NODE, observed_at=at, resource_version="1", node=node)


async def test_pods_metric_names_pods_and_batch_allocatable_counts_each_hp_pod_once(
    tmp_path: Path, koordbus_bus: JetStreamBus, database_url: str
) -> None:
    bus = koordbus_bus
    tree = FakeCgroupTree(root=tmp_path / "node", version=2, driver="systemd")
    tree.proc.cpus = 8
    web = tree.add_pod(WEB_UID, "Burstable", active_anon=1 * GiB)
    spark = tree.add_pod(SPARK_UID, "Burstable", active_anon=512 * MiB)
    tree.write()
    start = 1_750_000_020.0  # on a minute boundary
    now = [start]
    kubelet = Kubelet(200, json.dumps({"kind": "PodList", "items": [WEB, SPARK, GONE]}).encode())
    await db.run_migrations(database_url)
    engine = db.create_engine(database_url)
    store = NodeMetricStore(engine)
    nodemetric = NodeMetricService(bus, store, NodeMetricSettings(report_phase_step_seconds=0), registry=new_registry())
    await nodemetric.start()
    try:
        async with kubelet as url:
            settings = AgentSettings(node_name=NODE, proc_root=str(tree.proc_root), cgroup_root=str(tree.cgroup_root))
            agent = AgentService(settings, bus, clock=lambda: now[0], pods=KubeletPods(url))
            # 125 s of node life: the node busy 2 cores (100 ticks/s = 1 core), web 1 core, spark 0.5.
            for _ in range(126):
                await agent.collect_once()
                now[0] += 1.0
                tree.proc.user += 200
                tree.proc.idle += 600
                web.cpu_ns += 1_000_000_000
                spark.cpu_ns += 500_000_000
                tree.write()

        async def reported() -> bool:
            record = await store.get(NODE)
            return record is not None and record.report_time == start + 120

        await eventually(reported, timeout=30)
    finally:
        await nodemetric.stop()
        await engine.dispose()
    stored = await bus.last_on_subject(
        streams.KOORD_NODEMETRIC, f"{subjects.nodemetric_computed(NODE)}.*"
    )  # .<partition>
    assert stored is not None
    computed = msgspec.json.decode(stored.data, type=NodeMetricComputed)
    assert computed.report_time == start + 120
    pods = {f"{m.namespace}/{m.name}": m for m in computed.status.pods_metric}
    # named as the cluster names them, classes as Koordinator gives them; the listed pod without a cgroup is absent
    assert {key: (m.priority, m.qos) for key, m in pods.items()} == {
        "jobs/spark-exec-1": ("koord-batch", "BE"),
        "shop/web-0": ("koord-prod", "LS"),
    }
    web_usage = pods["shop/web-0"].pod_usage.resources
    assert abs(web_usage["cpu"] - 1000) <= 10 and web_usage["memory"] == 1 * GiB

    await publish(bus, config_event(), node_observed(start), *(observed(p, start) for p in (WEB, SPARK)))
    svc = service(bus, Clock(start + 150))
    await svc.start()
    try:
        await eventually(lambda: latest(bus), timeout=30)
        decision = await latest(bus)
    finally:
        await svc.stop()
    assert decision is not None and decision.outcome == "computed", decision
    # spec §2.4 by usage (the default policy): capacity − safety margin − max(system used, reserved 0) − HP used,
    # where HP used is web-0's usage alone: it has a metric (its request is not added, its metric does not dangle)
    # and spark-exec-1 is batch.
    system = computed.status.node_metric.system_usage.resources
    capacity_cpu, capacity_memory = 8000, 16 * GiB
    expected_cpu = capacity_cpu - capacity_cpu * 40 // 100 - system["cpu"] - web_usage["cpu"]
    expected_memory = capacity_memory - capacity_memory * 35 // 100 - system["memory"] - web_usage["memory"]
    explained = decision.explanation
    assert decision.resources[BATCH_CPU] == expected_cpu, explained
    assert decision.resources[BATCH_MEMORY] == expected_memory, explained
    assert abs(expected_cpu - 3300) <= 20  # 8 − 3.2 margin − 0.5 system − 1 web
    accounted = decision.pods
    assert (accounted.high_priority, accounted.high_priority_without_metric, accounted.dangling_metrics_counted) == (
        1,
        0,
        0,
    )
    assert accounted.low_priority_skipped == 1


async def test_a_pod_the_kubelet_lists_late_is_reported_by_uid_then_named_and_a_failed_list_keeps_the_names(
    tmp_path: Path,
) -> None:
    tree = FakeCgroupTree(root=tmp_path / "node", version=1, driver="cgroupfs")
    pods = [tree.add_pod(WEB_UID, "Burstable", active_anon=GiB), tree.add_pod(SPARK_UID, "Burstable")]
    tree.write()
    start = 1_750_000_020.0  # a window boundary
    now = [start]
    publisher = FlakyPublisher()
    kubelet = Kubelet(200, json.dumps({"kind": "PodList", "items": [WEB, GONE]}).encode())
    async with kubelet as url:
        settings = AgentSettings(node_name=NODE, proc_root=str(tree.proc_root), cgroup_root=str(tree.cgroup_root))
        agent = AgentService(settings, publisher, clock=lambda: now[0], pods=KubeletPods(url), pods_poll_interval=5)
        for second in range(31):
            if second == 12:  # the kubelet lists spark-exec-1 from now on; the agent reads the list at 15
                kubelet.body = json.dumps({"kind": "PodList", "items": [WEB, SPARK, GONE]}).encode()
            if second == 18:  # the kubelet goes away: the reads at 20, 25 and 30 fail
                kubelet.status, kubelet.body = 503, b"kubelet restarting"
            await agent.collect_once()
            now[0] += 1.0
            for pod in pods:
                pod.cpu_ns += 250_000_000
            tree.write()
    batches = [NODE_EVENT_DECODER.decode(data) for subject, data, _ in publisher.sent if subject.endswith("metrics")]
    assert all(isinstance(b, NodeMetricsReported) for b in batches)
    first, second, third = batches[:3]
    assert isinstance(first, NodeMetricsReported) and isinstance(second, NodeMetricsReported)
    assert isinstance(third, NodeMetricsReported)
    # [start, start+10): spark-exec-1 has a cgroup but is not listed yet; no-cgroup is listed but not invented
    assert [(p.uid, p.namespace, p.name) for p in first.pods] == [(WEB_UID, "shop", "web-0"), (SPARK_UID, "", "")]
    # [start+10, start+20): named by the list read at start+15, with its Koordinator labels
    assert [(p.namespace, p.name) for p in second.pods] == [("shop", "web-0"), ("jobs", "spark-exec-1")]
    assert second.pods[1].labels == {vocab.PRIORITY_CLASS_LABEL: "koord-batch", vocab.QOS_CLASS_LABEL: "BE"}
    # [start+20, start+30): the list could not be read, the names stay (the unchanged list is named by digest)
    assert third.pods == [] and third.pods_digest == second.pods_digest
    assert agent.stats.pod_list_failures == 3
