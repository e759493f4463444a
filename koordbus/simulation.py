"""Drives synthetic nodes (agent.simulate) through the real bus, for `koordbus up --simulate-nodes` and benches.

Every publish interval (aligned to wall-clock multiples, like a real agent) each simulated node
publishes one NodeMetricsReported batch, after one NodeStateReported with its capacity at start;
`backfill_seconds` of history are published first so windows, percentiles and charts have data right away. Each
node's NodeTopologyReported (agent.simulate_topology: what a real agent on a machine of its size reports) is
published at start and again every `topology_refresh_seconds` of the agent's settings, as a real agent refreshes it.

With `close_loop` the simulation follows the noderesource service's decisions (NodeResourceComputed on the bus) and
gives each simulated node its current batch allocatable: its batch pods are then placed only within it and evicted
when it shrinks (agent.simulate.place_batch_pods; each eviction is published as the agent publishes its own, a
PodEvictionRequested for the bridge and an ActuationApplied of the eviction loop, which the events API and the
dashboard's node page show like a real one), so batch used / allocatable stays at or under 100 % except right after
a shrink: the NodeMetric reported before it still names the pods evicted for it (the next report no longer does, as
koordlet reports only the pods on the node). Until a node's first decision it has no batch resources, like a node
koord-manager has not written yet, and runs no batch pods.

With `qos` each node's QoS loops plan in dry-run over its latest window (NodeQos, agent.simulate_qos): cpu-suppress,
be-cgroup, and the memory-evict and cpu-evict loops, whose planned victims are published as a dry-run agent publishes
them (an ActuationApplied per loop, dry_run=true, "eviction would be requested"; nothing asked of the bridge). The
cluster's resource-threshold-config (`SIMULATED_THRESHOLDS`) makes the hot nodes' peaks cross CPUEvict's threshold.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from typing import Final

import msgspec

from agent.batch import PodListThinner
from agent.loops import evict as evict_loop
from agent.loops.base import actuation_message
from agent.settings import AgentSettings
from agent.simulate import SimulatedNode, simulated_node_names
from agent.simulate_qos import BeCgroupPlanner, EvictPlanner, SuppressPlanner
from agent.simulate_topology import simulated_topology
from agent.slo import effective_slo, spec_problems
from bus import streams, subjects
from bus.api import Bus, FollowFrom, msg_id
from bus.errors import BusError
from schemas import kube, vocab
from schemas.cluster import ConfigMapObserved, NodeObserved
from schemas.node import NodeStateReported, encode_node_event
from schemas.node_topology import encode_topology
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from schemas.qos import NODE_SLO_DECODER, ActuationApplied
from schemas.scheduling import SchedulingNode
from services.noderesource import config as colocation

log = logging.getLogger(__name__)
RETRY_BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0)
"""Between attempts at a start-up publish (the last one repeats)."""
POD_LIST_RESEND_BATCHES = AgentSettings.pod_list_resend_batches
TOPOLOGY_REFRESH_SECONDS = AgentSettings.topology_refresh_seconds
SLO_REFRESH_SECONDS: Final = 30.0
"""How often the simulated nodes read their NodeSLOs (an agent watches its key; 30 s is often enough here)."""


def make_nodes(
    count: int, *, pods_per_node: int, seed: int = 7, loads: Mapping[str, tuple[float, float]] | None = None
) -> list[SimulatedNode]:
    """`count` nodes; `loads`: (online share of the CPU, peak hour) of the nodes that differ from the default."""
    nodes = []
    for i, name in enumerate(simulated_node_names(count)):
        load = (loads or {}).get(name)
        if load is None:
            nodes.append(SimulatedNode(name, seed=seed + i, pods=pods_per_node))
        else:
            share, peak = load
            nodes.append(SimulatedNode(name, seed=seed + i, pods=pods_per_node, online_share=share, peak_hour=peak))
    return nodes


async def publish_window(
    bus: Bus,
    nodes: list[SimulatedNode],
    window_start: float,
    window_end: float,
    *,
    thinners: dict[str, PodListThinner] | None = None,
    qos: NodeQos | None = None,
) -> int:
    """Publish one batch per node for [window_start, window_end), and what an agent publishes for the batch pods the
    node's placement evicted at the window's start (each PodEvictionRequested, and the eviction loops' ActuationApplied
    naming them); returns how many batches were new (not duplicates).

    With `thinners` (one per node, kept across windows) unchanged pod lists are left out like a real agent does.
    With `qos` each node's QoS loops plan in dry-run over the window (NodeQos, agent.simulate_qos).
    """
    batches: list[tuple[str, bytes, str]] = []
    evictions: list[tuple[str, bytes, str]] = []
    for node in nodes:
        batch = node.batch(window_start, window_end)
        if thinners is not None:
            batch = thinners.setdefault(node.name, PodListThinner(POD_LIST_RESEND_BATCHES)).thin(batch)
        batches.append(
            (subjects.node_metrics(node.name), encode_node_event(batch), msg_id(node.name, "metrics", window_start))
        )
        evictions.extend(evict_loop.eviction_message(request) for request in node.last_evictions)
        evictions.extend(actuation_message(event) for event in evict_loop.requested_actuations(node.last_evictions))
        if qos is not None:
            evictions.extend(actuation_message(event) for event in qos.plan(node))
    acks = await bus.publish_many([*batches, *evictions])
    return sum(1 for a in acks[: len(batches)] if not a.duplicate)


async def publish_states(bus: Bus, nodes: list[SimulatedNode], *, at: float) -> None:
    """Each node's NodeStateReported (its capacity), as a real agent sends at start, so the API's node views and
    the dashboard can show utilisation."""
    messages = [
        (
            subjects.node_state(node.name),
            encode_node_event(
                NodeStateReported(
                    node=node.name,
                    at=at,
                    agent_version="simulated",
                    cpu_cores=node.cpu_cores,
                    memory_total=node.memory_bytes,
                )
            ),
            msg_id(node.name, "state", at),
        )
        for node in nodes
    ]
    await bus.publish_many(messages)


async def publish_topologies(bus: Bus, nodes: list[SimulatedNode], *, at: float) -> None:
    """Each node's NodeTopologyReported read at `at`, with the message id a real agent's report of then has."""
    messages = []
    for node in nodes:
        report = simulated_topology(node.name, cpu_cores=node.cpu_cores, memory_bytes=node.memory_bytes, at=at)
        messages.append((subjects.node_topology(node.name), encode_topology(report), msg_id(node.name, "topology", at)))
    await bus.publish_many(messages)


SIMULATED_COLOCATION: Final = {"enable": True}
"""The colocation-config of a simulated cluster: Koordinator's defaults with colocation on."""
SIMULATED_THRESHOLDS: Final = {
    "clusterStrategy": {
        "enable": True,
        "cpuSuppressThresholdPercent": 65,
        "cpuSuppressPolicy": "cfsQuota",
        "memoryEvictThresholdPercent": 70,
        "cpuEvictThresholdPercent": 75,
        "cpuEvictTimeWindowSeconds": 10,
        "evictEnabledPriorityThreshold": vocab.PRIORITY_RANGES[vocab.PRIORITY_PROD][1],
    }
}
"""Its resource-threshold-config: BE CPU suppress on (Koordinator's 65 %), by CFS quota; BE memory eviction at
Koordinator's 70 %; CPUEvict when the node's CPU over 10 s reaches 75 %, of the pods that opt in with
`koordinator.sh/eviction-enabled: "true"` up to koord-prod's priorities (agent.simulate.EVICTABLE_APPS: a hot node
past its peak, above the descheduler's 70 %, gets some planned)."""
RESOURCE_THRESHOLD_KEY: Final = "resource-threshold-config"


class NodeQos:
    """The simulated nodes' QoS loops in dry-run: each node's cpu-suppress, be-cgroup, memory-evict and cpu-evict
    planners over its NodeSLO, read from the KV bucket as the node's agent reads its own key (`refresh`, every NodeSLO
    refresh of the agent)."""

    def __init__(self, nodes: list[SimulatedNode]) -> None:
        self.suppress = {node.name: SuppressPlanner(node.name, cpu_cores=node.cpu_cores) for node in nodes}
        self.be_cgroups = {node.name: BeCgroupPlanner(node.name) for node in nodes}
        self.evictions = {
            node.name: EvictPlanner(node.name, cpu_cores=node.cpu_cores, memory_bytes=node.memory_bytes)
            for node in nodes
        }
        self.slos: dict[str, tuple[dict[str, object], int]] = {}

    async def refresh(self, bus: Bus) -> None:
        for name in self.suppress:
            stored = await bus.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(name), direct=True)
            if stored is None or stored.headers.get("KV-Operation") in ("DEL", "PURGE"):
                self.slos.pop(name, None)
                continue
            try:
                spec = NODE_SLO_DECODER.decode(stored.data).spec
            except msgspec.MsgspecError:
                continue
            if not spec_problems(spec):
                self.slos[name] = (effective_slo(spec), stored.stream_seq)

    def plan(self, node: SimulatedNode) -> list[ActuationApplied]:
        """The events of the node's loops over its latest window (none before its NodeSLO is read)."""
        tick, listed = node.last_second
        slo = self.slos.get(node.name)
        if tick is None or slo is None:
            return []
        events = [
            self.suppress[node.name].plan(tick, listed, slo=slo[0], slo_revision=slo[1]),
            self.be_cgroups[node.name].plan(tick.at, listed, slo=slo[0], slo_revision=slo[1]),
            *self.evictions[node.name].plan(tick, listed, node_cpu=node.last_node_cpu, slo=slo[0], slo_revision=slo[1]),
        ]
        return [event for event in events if event is not None]


async def publish_cluster(bus: Bus, nodes: list[SimulatedNode], *, at: float) -> None:
    """What the Kubernetes bridge would publish for a cluster of these nodes: each Node (capacity and allocatable)
    and an slo-controller-config with colocation enabled, so the noderesource service decides their batch and mid
    resources (the pods it sees only through NodeMetric count as prod unless their priority says otherwise)."""
    messages = []
    for node in nodes:
        amounts: dict[str, str | int | float] = {"cpu": f"{node.cpu_cores:g}", "memory": str(node.memory_bytes)}
        observed = NodeObserved(
            name=node.name,
            observed_at=at,
            resource_version="1",
            node=SchedulingNode(
                metadata=kube.ObjectMeta(name=node.name), status=kube.NodeStatus(capacity=amounts, allocatable=amounts)
            ),
        )
        messages.append((subjects.cluster_node(node.name), msgspec.json.encode(observed), msg_id(node.name, "node")))
    config = ConfigMapObserved(
        namespace=colocation.CONFIGMAP_NAMESPACE,
        name=colocation.CONFIGMAP_NAME,
        observed_at=at,
        resource_version="1",
        data={
            colocation.COLOCATION_CONFIG_KEY: json.dumps(SIMULATED_COLOCATION),
            RESOURCE_THRESHOLD_KEY: json.dumps(SIMULATED_THRESHOLDS),
        },
    )
    subject = subjects.cluster_configmap(colocation.CONFIGMAP_NAMESPACE, colocation.CONFIGMAP_NAME)
    messages.append((subject, msgspec.json.encode(config), msg_id("simulated", "colocation-config")))
    await bus.publish_many(messages)


def batch_allocatable(computed: NodeResourceComputed) -> tuple[float, int]:
    """(cores, bytes) of batch-cpu (millicores) and batch-memory a decision gives its node; 0 for a removed one."""
    cpu = computed.resources.get(vocab.BATCH_CPU)
    memory = computed.resources.get(vocab.BATCH_MEMORY)
    return (cpu or 0) / 1000, memory or 0


FOLLOW_RETRY_SECONDS: Final = 2.0


async def follow_batch_allocatable(bus: Bus, nodes: list[SimulatedNode], *, since: float) -> None:
    """Give each node the batch allocatable of every decision on it stored from `since` on, until cancelled."""
    by_name = {node.name: node for node in nodes}
    while True:
        try:
            follower = await bus.follow(
                streams.KOORD_NODERESOURCE, [subjects.NODERESOURCE_COMPUTED_ALL], FollowFrom(time=since)
            )
            break
        except BusError as e:  # the stream is created by the noderesource service as it starts
            log.info("simulation: cannot follow batch resources yet: %s", e)
            await asyncio.sleep(FOLLOW_RETRY_SECONDS)
    try:
        while True:
            for delivery in await follower.next():
                try:
                    computed = NODERESOURCE_COMPUTED_DECODER.decode(delivery.data)
                except msgspec.MsgspecError:
                    continue
                node = by_name.get(computed.node)
                if node is not None:
                    node.set_batch_allocatable(*batch_allocatable(computed))
    finally:
        await follower.close()


async def run_simulation(
    bus: Bus,
    nodes: list[SimulatedNode],
    *,
    interval: float = 10.0,
    backfill_seconds: float = 0.0,
    cluster: bool = False,
    close_loop: bool = False,
    qos: bool = False,
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Backfill, then publish every `interval` forever (until cancelled; `sleep` waits for the next window).
    `cluster`: also publish the nodes as the Kubernetes bridge would (only where no real cluster is connected).
    `close_loop`: place batch pods within each node's batch allocatable as the noderesource service decides it.
    `qos`: each node's QoS loops plan in dry-run after the backfill (NodeQos), their actuations published."""
    now = clock()
    if close_loop:
        for node in nodes:
            node.set_batch_allocatable(0.0, 0)
        follow = asyncio.create_task(follow_batch_allocatable(bus, nodes, since=now), name="simulation-allocatable")
    try:
        await _publish_forever(
            bus,
            nodes,
            interval=interval,
            backfill_seconds=backfill_seconds,
            cluster=cluster,
            qos=NodeQos(nodes) if qos else None,
            clock=clock,
            sleep=sleep,
        )
    finally:
        if close_loop:
            follow.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await follow


async def _publish_forever(
    bus: Bus,
    nodes: list[SimulatedNode],
    *,
    interval: float,
    backfill_seconds: float,
    cluster: bool,
    qos: NodeQos | None,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[object]],
) -> None:
    now = clock()
    current = (now // interval) * interval
    start = current - (backfill_seconds // interval) * interval
    window = start
    thinners: dict[str, PodListThinner] = {}
    if cluster:
        await _until_published("the cluster's nodes", functools.partial(publish_cluster, bus, nodes, at=now))
    await _until_published("the node states", functools.partial(publish_states, bus, nodes, at=start))
    await _until_published("the node topologies", functools.partial(publish_topologies, bus, nodes, at=now))
    topology_due = now + TOPOLOGY_REFRESH_SECONDS
    slo_due = now
    while window < current:
        await _until_published(
            f"the backfill window at {window:.0f}",
            functools.partial(publish_window, bus, nodes, window, window + interval, thinners=thinners),
        )
        window += interval
    if backfill_seconds:
        log.info("simulation: backfilled %d s of history for %d nodes", int(current - start), len(nodes))
    while True:
        next_end = window + interval
        await sleep(max(next_end - clock(), 0.0))
        if qos is not None and clock() >= slo_due:
            try:
                await qos.refresh(bus)
                slo_due = clock() + SLO_REFRESH_SECONDS
            except BusError as e:  # the last NodeSLOs read stay in effect, as an agent keeps its last good one
                log.warning("simulation: could not read the NodeSLOs: %s", e)
        try:
            await publish_window(bus, nodes, window, next_end, thinners=thinners, qos=qos)
        except Exception as e:  # the bus may be away; the simulation skips the window like a lossy agent would
            log.warning("simulation: could not publish window %s: %s", window, e)
        window = next_end
        if (at := clock()) >= topology_due:
            try:
                await publish_topologies(bus, nodes, at=at)
                topology_due = at + TOPOLOGY_REFRESH_SECONDS
            except Exception as e:  # tried again after the next window, as an agent retries at its next round
                log.warning("simulation: could not publish the node topologies: %s", e)


async def _until_published(what: str, publish: Callable[[], Awaitable[object]]) -> None:
    """Publish, retrying with backoff while the bus fails (a publish timed out under load, the server away): the
    start-up state and history are published once, and a single failure used to end the simulation for good."""
    for attempt in itertools.count():
        try:
            await publish()
            return
        except BusError as e:
            delay = RETRY_BACKOFF_SECONDS[min(attempt, len(RETRY_BACKOFF_SECONDS) - 1)]
            log.warning("simulation: publishing %s failed (%s); retrying in %.1f s", what, e, delay)
            await asyncio.sleep(delay)
