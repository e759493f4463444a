"""A synthetic cluster for the noderesource benchmark: nodes, pods, the colocation ConfigMap and drifting NodeMetrics.

bench/noderesource.py seeds KOORD_CLUSTER with `cluster_messages` (one Node per node, its pods, the
slo-controller-config ConfigMap with colocation enabled) and starts `run_metric_publisher` in its own process to
publish one NodeMetricComputed per node per interval, spread evenly over the interval, as the nodemetric service
would. The pod mix is fixed per pod index (`PodShape`): ~70% prod pods with cpu/memory requests, ~20% batch pods
requesting kubernetes.io/batch-cpu/memory, ~5% prod pods pending on their node and ~5% unscheduled. A node's prod
pods use their cpu request times the node's load level (`DriftingLoad`; memory follows it at a quarter of the
pace), which moves a little each report and now and then jumps, so most decisions stay within
resourceDiffThreshold and some cross it. Each NodeMetric's report time
(and status.updateTime) is its publish time, so a decision's computed_at names the NodeMetric that caused it.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from multiprocessing.sharedctypes import Synchronized
from multiprocessing.synchronize import Event

import msgspec

from bus import subjects
from bus.api import msg_id
from bus.errors import BusError
from bus.jetstream import JetStreamBus
from schemas import kube, vocab
from schemas.cluster import ConfigMapObserved, NodeObserved, PodObserved
from schemas.node import (
    MetricCollectPolicy,
    NodeMetricComputed,
    NodeMetricInfo,
    NodeMetricStatus,
    PodMetric,
    ResourceMap,
)
from services.noderesource import config as colocation

log = logging.getLogger("bench.cluster_load")

GI = 1024**3
NODE_CPU_MILLI = 96_000
NODE_MEMORY = 384 * GI
SYSTEM_CPU_MILLI = 2_000
SYSTEM_MEMORY = 8 * GI
NAMESPACE = "bench"
JUMP_PROBABILITY = 0.05
"""Share of reports where a node's load jumps (enough to cross resourceDiffThreshold); otherwise it drifts."""
DRIFT_STEP = 0.005
JUMP_STEP = (0.25, 0.4)
LOAD_RANGE = (0.2, 0.95)
MEMORY_FOLLOWS_LOAD = 0.25
"""A pod's memory use is 60% of its request plus this share of the load level: memory moves slower than cpu."""
STOP_POLL_SECONDS = 0.1
DRAIN_TIMEOUT_SECONDS = 15.0

Message = tuple[str, bytes, str]
"""(subject, data, msg id), as JetStreamBus.publish_many takes them."""


def node_name(index: int) -> str:
    return f"bench-node-{index:05d}"


@dataclass(frozen=True)
class PodShape:
    """What pod `index` of every node is: its class, requests, and whether it runs, is pending or is unscheduled."""

    kind: str
    """"prod", "batch", "pending" (prod, bound, not started) or "unscheduled" (prod, no node)."""
    cpu_milli: int
    memory: int

    @classmethod
    def of(cls, index: int) -> PodShape:
        slot = index % 20
        kind = "batch" if slot % 10 < 2 else "pending" if slot == 9 else "unscheduled" if slot == 19 else "prod"
        cpu_milli = (250, 500, 1000, 2000)[index % 4]
        return cls(kind=kind, cpu_milli=cpu_milli, memory=cpu_milli * 4 * 2**20)

    @property
    def runs(self) -> bool:
        return self.kind in ("prod", "batch")


def node_event(index: int, *, at: float) -> NodeObserved:
    node = msgspec.convert(
        {
            "metadata": {"name": node_name(index), "labels": {"bench": "true"}},
            "status": {
                "capacity": {"cpu": str(NODE_CPU_MILLI // 1000), "memory": f"{NODE_MEMORY // GI}Gi"},
                "allocatable": {"cpu": str(NODE_CPU_MILLI // 1000 - 2), "memory": f"{NODE_MEMORY // GI - 8}Gi"},
            },
        },
        kube.Node,
    )
    return NodeObserved(name=node_name(index), observed_at=at, resource_version="1", node=node)


def pod_name(node_index: int, pod_index: int) -> str:
    return f"pod-{node_index:05d}-{pod_index:03d}"


def pod_event(node_index: int, pod_index: int, *, at: float) -> PodObserved:
    shape = PodShape.of(pod_index)
    name = pod_name(node_index, pod_index)
    if shape.kind == "batch":
        requests = {vocab.BATCH_CPU: str(shape.cpu_milli), vocab.BATCH_MEMORY: str(shape.memory)}
        priority = vocab.PRIORITY_BATCH
        qos = "BestEffort"
    else:
        requests = {"cpu": f"{shape.cpu_milli}m", "memory": str(shape.memory)}
        priority = vocab.PRIORITY_PROD
        qos = "Burstable"
    node = "" if shape.kind == "unscheduled" else node_name(node_index)
    pod = msgspec.convert(
        {
            "metadata": {"name": name, "namespace": NAMESPACE, "labels": {vocab.PRIORITY_CLASS_LABEL: priority}},
            "spec": {"nodeName": node, "containers": [{"name": "main", "resources": {"requests": requests}}]},
            "status": {"phase": "Running" if shape.runs else "Pending", "qosClass": qos},
        },
        kube.Pod,
    )
    return PodObserved(namespace=NAMESPACE, name=name, observed_at=at, node_name=node, resource_version="1", pod=pod)


def configmap_event(*, at: float) -> ConfigMapObserved:
    return ConfigMapObserved(
        namespace=colocation.CONFIGMAP_NAMESPACE,
        name=colocation.CONFIGMAP_NAME,
        observed_at=at,
        resource_version="1",
        data={colocation.COLOCATION_CONFIG_KEY: json.dumps({"enable": True})},
    )


def cluster_messages(nodes: int, pods: int, *, at: float) -> Iterator[Message]:
    """The ConfigMap, then each node followed by its pods, as KOORD_CLUSTER messages."""
    config = configmap_event(at=at)
    yield (
        subjects.cluster_configmap(config.namespace, config.name),
        msgspec.json.encode(config),
        msg_id("bench.configmap", at),
    )
    for n in range(nodes):
        yield (
            subjects.cluster_node(node_name(n)),
            msgspec.json.encode(node_event(n, at=at)),
            msg_id("bench.node", n, at),
        )
        for p in range(pods):
            event = pod_event(n, p, at=at)
            yield subjects.cluster_pod(NAMESPACE, event.name), msgspec.json.encode(event), msg_id("bench.pod", n, p, at)


class DriftingLoad:
    """A node's load level in LOAD_RANGE: a small step each report, a large one with JUMP_PROBABILITY."""

    def __init__(self, seed: int) -> None:
        self._random = random.Random(seed)
        self.level = self._random.uniform(0.4, 0.7)

    def step(self) -> float:
        size = self._random.uniform(*JUMP_STEP) if self._random.random() < JUMP_PROBABILITY else DRIFT_STEP
        moved = self.level + self._random.choice((-1, 1)) * size
        low, high = LOAD_RANGE
        if not low <= moved <= high:  # bounce back into the range
            moved = self.level - (moved - self.level)
        self.level = min(max(moved, low), high)
        return self.level


class NodeMetricTemplate:
    """One node's NodeMetricComputed with the pod list fixed and the usages scaled by its load level."""

    def __init__(self, node_index: int, pods: int) -> None:
        self.node = node_name(node_index)
        self._pods = [(pod_name(node_index, p), shape) for p in range(pods) if (shape := PodShape.of(p)).runs]

    def render(self, load: float, *, at: float) -> NodeMetricComputed:
        metrics = []
        cpu_total, memory_total = SYSTEM_CPU_MILLI, SYSTEM_MEMORY
        for name, shape in self._pods:
            cpu, memory = int(shape.cpu_milli * load), int(shape.memory * (0.6 + MEMORY_FOLLOWS_LOAD * load))
            cpu_total += cpu
            memory_total += memory
            metrics.append(
                PodMetric(
                    namespace=NAMESPACE,
                    name=name,
                    pod_usage=ResourceMap(resources={"cpu": cpu, "memory": memory}),
                    priority=vocab.PRIORITY_BATCH if shape.kind == "batch" else vocab.PRIORITY_PROD,
                    qos="BE" if shape.kind == "batch" else "LS",
                )
            )
        system = ResourceMap(resources={"cpu": SYSTEM_CPU_MILLI, "memory": SYSTEM_MEMORY})
        return NodeMetricComputed(
            node=self.node,
            report_time=at,
            spec=MetricCollectPolicy(),
            status=NodeMetricStatus(
                update_time=at,
                node_metric=NodeMetricInfo(
                    node_usage=ResourceMap(resources={"cpu": cpu_total, "memory": memory_total}),
                    aggregated_node_usages=[],
                    system_usage=system,
                    aggregated_system_usages=[],
                ),
                pods_metric=metrics,
            ),
        )


def nodemetric_message(template: NodeMetricTemplate, load: float, *, at: float) -> Message:
    event = template.render(load, at=at)
    return subjects.nodemetric_computed(template.node), msgspec.json.encode(event), msg_id("bench.nm", event.node, at)


# --- the publisher process


@dataclass(frozen=True, kw_only=True)
class PublisherConfig:
    nats_url: str
    nodes: int
    pods: int
    interval: float
    max_in_flight: int = 256


_FIELDS = ("published", "errors", "lag_max_s")


class PublisherCounters:
    """Shared-memory tallies the publisher keeps and the benchmark reads (resetting the lag maximum)."""

    def __init__(self, ctx: SpawnContext) -> None:
        self._values: list[Synchronized[float]] = [ctx.Value("d", 0.0) for _ in _FIELDS]

    def add(self, field: str, amount: float = 1.0) -> None:
        value = self._values[_FIELDS.index(field)]
        with value.get_lock():
            value.value = max(value.value, amount) if field == "lag_max_s" else value.value + amount

    def read(self, *, reset_lag: bool = False) -> dict[str, float]:
        raw = {name: v.value for name, v in zip(_FIELDS, self._values, strict=True)}
        if reset_lag:
            self._values[_FIELDS.index("lag_max_s")].value = 0.0
        return raw


def run_metric_publisher(config: PublisherConfig, counters: PublisherCounters, stop: Event) -> None:
    """Process entry point: node i's NodeMetric at start + k × interval + i × interval / nodes until `stop`."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the benchmark stops us through `stop`, also on Ctrl-C
    logging.basicConfig(level=logging.INFO, format="%(asctime)s nodemetric-publisher: %(message)s")
    asyncio.run(_publish(config, counters, stop))


async def _publish(config: PublisherConfig, counters: PublisherCounters, stop: Event) -> None:
    templates = [NodeMetricTemplate(i, config.pods) for i in range(config.nodes)]
    loads = [DriftingLoad(seed=i) for i in range(config.nodes)]
    bus = await JetStreamBus.connect(config.nats_url, name="bench-nodemetrics", max_in_flight=config.max_in_flight)
    in_flight = asyncio.Semaphore(config.max_in_flight)
    tasks: set[asyncio.Task[None]] = set()

    async def send(message: Message) -> None:
        try:
            await bus.publish(message[0], message[1], msg_id=message[2])
        except BusError as e:
            counters.add("errors")
            log.warning("publish on %s failed: %s", message[0], e)
        else:
            counters.add("published")
        finally:
            in_flight.release()

    step = config.interval / config.nodes
    start = time.time()
    try:
        while not stop.is_set():
            for index in range(config.nodes):
                due = start + index * step
                while (now := time.time()) < due:
                    if stop.is_set():
                        return
                    await asyncio.sleep(min(due - now, STOP_POLL_SECONDS))
                await in_flight.acquire()
                now = time.time()
                counters.add("lag_max_s", now - due)
                task = asyncio.create_task(send(nodemetric_message(templates[index], loads[index].step(), at=now)))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            start += config.interval
    finally:
        if tasks:
            await asyncio.wait(tasks, timeout=DRAIN_TIMEOUT_SECONDS)
        await bus.close()
