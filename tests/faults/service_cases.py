"""Per service, what tests/faults/test_kill_and_restart.py needs: inputs, load, consumers, decisions, projection.

Each `Case` says how to put the service's inputs on the bus before it starts (`setup`) and while it runs (`load`,
one step at a time), which durable consumers it runs (to tell when it has caught up), which streams hold its
decisions and how to read them back with the identity that must be unique, and how to read its projection through
its store. The loads are small (a few hundred events) so a case with a kill, a restart and a clean replay stays
well under 20 s on two cores; their content is drawn from the test's seeded random generator.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import math
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import msgspec
from sqlalchemy.ext.asyncio import AsyncEngine

import tests.support.migration as migration_support
import tests.unit.test_noderesource_state as nr
import tests.unit.test_quota_model as quota_model
import tests.unit.test_quota_validation as quota_validation
import tests.unit.test_slo_core as slo_core
from agent.simulate import SimulatedNode
from bus import streams, subjects
from bus.api import Delivery, msg_id
from bus.errors import BusUnavailableError
from bus.jetstream import JetStreamBus
from schemas import migration_events as mev
from schemas import quota_events as ev
from schemas.cluster import NodeObserved, PodObserved, WorkloadObserved
from schemas.node import NodeMetricsReported, encode_node_event
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from schemas.qos import NODE_SLO_DECODER
from schemas.quota_service import CommandReply, CommandRequest
from services.migration import service as migration_service
from services.migration.store import MigrationStore
from services.nodemetric import service as nodemetric
from services.nodemetric.store import NodeMetricStore
from services.noderesource import service as noderesource
from services.noderesource.state import is_repeat
from services.noderesource.store import NodeResourceStore
from services.quota import service as quota_service
from services.quota.store import QuotaStore
from services.slo import service as slo
from tests.faults.processes import stream_messages
from tests.support.events import publish_events

PAGE = 10_000

Decisions = list[Any]


@dataclass(kw_only=True)
class Case:
    service: str
    durables: tuple[tuple[str, str], ...]
    """(stream, durable) of every consumer the service runs."""
    decision_streams: tuple[str, ...]
    setup: Callable[[JetStreamBus], Awaitable[None]]
    load: Callable[[JetStreamBus, int], Awaitable[None]]
    read_decisions: Callable[[JetStreamBus], Awaitable[Decisions]]
    """The decisions in their streams, oldest first, each as its identity (what must not repeat)."""
    read_projection: Callable[[JetStreamBus, AsyncEngine | None], Awaitable[Any]]
    min_decisions: int
    steps: int = 40
    step_seconds: float = 0.1
    kill_window: float = 2.5
    """The SIGKILL comes within this many seconds (drawn uniformly) after the service's consumers started."""
    database: bool = True
    env: Mapping[str, str] = field(default_factory=dict)
    after_start: Callable[[JetStreamBus], Awaitable[None]] = field(default=lambda bus: _nothing())
    """Once the first process's consumers run: inputs that need the service to answer (quota commands)."""
    repeats: Callable[[JetStreamBus], Awaitable[Decisions]] = field(default=lambda bus: _none())
    """Decisions that repeat their predecessor's content under a new identity (a republish after a restart)."""

    def assert_no_duplicates(self, decisions: Decisions, what: str) -> None:
        seen: set[Any] = set()
        repeated = [d for d in decisions if d in seen or seen.add(d)]  # type: ignore[func-returns-value]
        assert not repeated, f"{what}: decisions stored more than once: {repeated[:5]}"

    def enough(self, decisions: Decisions) -> bool:
        return len(decisions) >= self.min_decisions


async def _nothing() -> None:
    return None


async def _none() -> Decisions:
    return []


def _ids(messages: list[Delivery]) -> Decisions:
    return [(m.subject, m.msg_id) for m in messages]


# ---- nodemetric: agent batches in, NodeMetricComputed out, the latest per node (and node liveness) projected


def nodemetric_case(rng: random.Random, *, prefix: str = "fault", steps: int = 40) -> Case:
    nodes = [SimulatedNode(f"{prefix}-node-{i}", seed=rng.randrange(1 << 30), pods=4) for i in range(4)]
    window = 10.0
    # Event times 20 minutes back (inside the service's 32-minute replay window): 40 windows are 6-7 reports per
    # node; more steps start further back (up to 180 fit), so the last window still ends in the past.
    base = math.floor(time.time() / 60) * 60 - max(20 * 60, (steps + 6) * window)
    batches: list[list[NodeMetricsReported]] = [
        [node.batch(base + step * window, base + (step + 1) * window) for node in nodes] for step in range(steps)
    ]

    async def load(bus: JetStreamBus, step: int) -> None:
        await bus.publish_many(
            [
                (subjects.node_metrics(b.node), encode_node_event(b), msg_id(b.node, "metrics", b.window_start))
                for b in batches[step]
            ]
        )

    async def decisions(bus: JetStreamBus) -> Decisions:
        return _ids(await stream_messages(bus, streams.KOORD_NODEMETRIC, subjects.NODEMETRIC_COMPUTED_ALL))

    async def projection(bus: JetStreamBus, engine: AsyncEngine | None) -> Any:
        assert engine is not None
        store = NodeMetricStore(engine)
        return await store.list(limit=PAGE), await store.nodes(limit=PAGE)

    return Case(
        service="nodemetric",
        durables=(
            (streams.KOORD_NODE, nodemetric.INGEST_CONSUMER),
            (streams.KOORD_NODEMETRIC, nodemetric.PROJECTOR_CONSUMER),
        ),
        decision_streams=(streams.KOORD_NODEMETRIC,),
        setup=lambda bus: _nothing(),
        load=load,
        read_decisions=decisions,
        read_projection=projection,
        min_decisions=4 * 5,
        steps=steps,
    )


# ---- noderesource: nodes, pods, the colocation ConfigMap and NodeMetrics in, batch/mid decisions out and projected


def noderesource_case(rng: random.Random, *, prefix: str = "fault", steps: int = 40) -> Case:
    names = [f"{prefix}-node-{i}" for i in range(4)]
    now = time.time()

    async def setup(bus: JetStreamBus) -> None:
        await publish_events(bus, nr.config_event(), *[nr.node_event(n) for n in names])
        await publish_events(bus, *[nr.pod_event(f"prod-{n}", "20", "40Gi", node=n) for n in names])

    async def load(bus: JetStreamBus, step: int) -> None:
        # Fresh NodeMetrics whose system usage moves by whole cores (past the diff threshold), and pods coming
        # and going; report times are real (a stale NodeMetric would degrade the node).
        events: list[Any] = [
            nr.metric_event(n, at=now + step, system_cores=rng.randrange(1, 30)) for n in names if rng.random() < 0.7
        ]
        if rng.random() < 0.3:
            node = rng.choice(names)
            batch = f"{prefix}-batch-{step}"
            events.append(nr.pod_event(batch, "2", "4Gi", node=node, priority="koord-batch", at=now))
        await publish_events(bus, *events)

    async def decisions(bus: JetStreamBus) -> Decisions:
        return _ids(await stream_messages(bus, streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_COMPUTED_ALL))

    async def repeats(bus: JetStreamBus) -> Decisions:
        stored = await stream_messages(bus, streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_COMPUTED_ALL)
        last: dict[str, NodeResourceComputed] = {}
        repeated: Decisions = []
        for message in stored:
            decision = NODERESOURCE_COMPUTED_DECODER.decode(message.data)
            if is_repeat(last.get(decision.node), decision):
                repeated.append((message.subject, decision.computed_at))
            last[decision.node] = decision
        return repeated

    async def projection(bus: JetStreamBus, engine: AsyncEngine | None) -> Any:
        assert engine is not None
        store = NodeResourceStore(engine)
        return await store.list(limit=PAGE), [await store.history(n, limit=PAGE) for n in names]

    return Case(
        service="noderesource",
        durables=(
            (streams.KOORD_CLUSTER, noderesource.CLUSTER_CONSUMER),
            (streams.KOORD_NODEMETRIC, noderesource.NODEMETRIC_CONSUMER),
            (streams.KOORD_NODERESOURCE, noderesource.PROJECTOR_CONSUMER),
        ),
        decision_streams=(streams.KOORD_NODERESOURCE,),
        setup=setup,
        load=load,
        read_decisions=decisions,
        repeats=repeats,
        read_projection=projection,
        min_decisions=10,
        steps=steps,
    )


# ---- slo: Nodes and the slo-controller-config ConfigMap in, each node's NodeSLO in the KOORD_SLO bucket out


def slo_case(
    rng: random.Random, *, prefix: str = "fault", steps: int = 40, configmap: Mapping[str, str] | None = None
) -> Case:
    """`configmap`: other keys of the slo-controller-config ConfigMap, kept in every version this case publishes
    (noderesource's colocation-config when both run)."""
    names = [f"{prefix}-node-{i}" for i in range(6)]
    pools = ["batch", "online", "edge"]

    def threshold(percent: int) -> str:
        return json.dumps(
            {
                "clusterStrategy": {"enable": True},
                "nodeStrategies": [
                    {"nodeSelector": {"matchLabels": {"pool": "batch"}}, "cpuSuppressThresholdPercent": percent}
                ],
            }
        )

    async def setup(bus: JetStreamBus) -> None:
        await publish_events(
            bus, slo_core._configmap({**(configmap or {}), "resource-threshold-config": threshold(50)})
        )
        await publish_events(bus, *[slo_core._node(n, {"pool": rng.choice(pools)}) for n in names])

    async def load(bus: JetStreamBus, step: int) -> None:
        if step % 8 == 7:
            data = {**(configmap or {}), "resource-threshold-config": threshold(30 + step % 60)}
            await publish_events(bus, slo_core._configmap(data))
        else:
            await publish_events(bus, slo_core._node(rng.choice(names), {"pool": rng.choice(pools)}))

    async def decisions(bus: JetStreamBus) -> Decisions:
        return _ids(await stream_messages(bus, streams.KV_KOORD_SLO, subjects.SLO_ALL))

    async def projection(bus: JetStreamBus, engine: AsyncEngine | None) -> Any:
        values = {}
        for name in names:
            stored = await bus.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(name))
            values[name] = None if stored is None else NODE_SLO_DECODER.decode(stored.data).spec
        return values

    return Case(
        service="slo",
        durables=((streams.KOORD_CLUSTER, slo.CLUSTER_CONSUMER),),
        decision_streams=(streams.KV_KOORD_SLO,),
        setup=setup,
        load=load,
        read_decisions=decisions,
        read_projection=projection,
        min_decisions=len(names),
        steps=steps,
        database=False,
    )


async def _command(bus: JetStreamBus, request: CommandRequest) -> CommandReply:
    """A quota command, retried while nobody answers yet (the service serves requests after its start-up replay)."""
    deadline = time.monotonic() + 20
    while True:
        try:
            data = await bus.request(subjects.QUOTA_RPC_COMMAND, msgspec.json.encode(request), timeout=5)
        except BusUnavailableError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)
        else:
            return msgspec.json.decode(data, type=CommandReply)


# ---- quota: the quota event log (commands) and the cluster's pods in, statuses out, statuses and history projected


def quota_case(rng: random.Random, *, prefix: str = "fault", steps: int = 40) -> Case:
    leaves = ["a", "b", "c"]
    node_name = f"{prefix}-node-0"
    # Observed when the other cases' objects are (the colocation ConfigMap's time): with the noderesource service
    # running too (test_cluster_combined.py), a node and pods observed "before" the ConfigMap made a clean replay's
    # decision for this node, which takes in the ConfigMap, newer than the live one, which came after it.
    observed_at = nr.T0

    async def setup(bus: JetStreamBus) -> None:
        node = quota_model.node(node_name, "64")
        await bus.publish(
            subjects.cluster_node(node_name),
            msgspec.json.encode(NodeObserved(name=node_name, observed_at=observed_at, node=node)),
            msg_id=node_name,
        )

    async def after_start(bus: JetStreamBus) -> None:
        quotas = [quota_validation.eq("org", is_parent=True, min={"cpu": "48"}, max={"cpu": "64"})]
        quotas += [quota_validation.eq(leaf, parent="org", min={"cpu": "16"}, max={"cpu": "64"}) for leaf in leaves]
        for spec in quotas:
            request = CommandRequest(
                actor="faults", command=ev.CreateQuota(command_id=f"create-{spec.metadata.name}", quota=spec)
            )
            reply = await _command(bus, request)
            assert reply.outcome == "applied", reply

    async def load(bus: JetStreamBus, step: int) -> None:
        name = f"pod-{step}"
        if step > 5 and rng.random() < 0.3:  # an earlier pod goes away
            name = f"pod-{rng.randrange(step)}"
            gone = PodObserved(namespace="apps", name=name, observed_at=observed_at, deleted=True)
            await bus.publish(subjects.cluster_pod("apps", name), msgspec.json.encode(gone), msg_id=f"{name}-gone")
            return
        pod = quota_model.pod(name, f"{rng.randrange(1, 6)}", quota_name=rng.choice(leaves), node_name=node_name)
        event = PodObserved(namespace="apps", name=name, observed_at=observed_at, pod=pod)
        await bus.publish(subjects.cluster_pod("apps", name), msgspec.json.encode(event), msg_id=name)

    async def decisions(bus: JetStreamBus) -> Decisions:
        return _ids(await stream_messages(bus, streams.KOORD_QUOTA, subjects.QUOTA_EVENTS_ALL)) + _ids(
            await stream_messages(bus, streams.KOORD_QUOTA_STATUS, subjects.QUOTA_STATUS_ALL)
        )

    async def projection(bus: JetStreamBus, engine: AsyncEngine | None) -> Any:
        assert engine is not None
        store = QuotaStore(engine)
        statuses = await store.quotas()
        return statuses, await store.trees(), [await store.history(s.quota, limit=PAGE) for s in statuses]

    return Case(
        service="quota",
        durables=(
            (streams.KOORD_QUOTA, quota_service.EVENTS_CONSUMER),
            (streams.KOORD_CLUSTER, quota_service.CLUSTER_CONSUMER),
            (streams.KOORD_QUOTA, quota_service.HISTORY_PROJECTOR),
            (streams.KOORD_QUOTA_STATUS, quota_service.STATUS_PROJECTOR),
        ),
        decision_streams=(streams.KOORD_QUOTA, streams.KOORD_QUOTA_STATUS),
        setup=setup,
        after_start=after_start,
        load=load,
        read_decisions=decisions,
        read_projection=projection,
        min_decisions=len(leaves) + 1,
        steps=steps,
        env={"KOORDBUS_TICK_SECONDS": "0.2", "KOORDBUS_LINGER_SECONDS": "0"},
    )


# ---- migration: PodMigrationJob requests and the cluster in, arbitration rounds out, jobs and trails projected


def migration_case(rng: random.Random, *, prefix: str = "fault", steps: int = 40) -> Case:
    replicas = 20
    created = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # within the jobs' 5-minute TTL

    async def setup(bus: JetStreamBus) -> None:
        workload = WorkloadObserved(
            namespace="default", name="web", observed_at=1.0, api_version="apps/v1", kind="ReplicaSet", uid="rs-1",
            replicas=replicas,
        )  # fmt: skip
        await bus.publish(subjects.cluster_workload("default", "web"), msgspec.json.encode(workload), msg_id="web")
        for i in range(replicas):
            pod = migration_support.pod(f"web-{i}", node=f"{prefix}-node-{i % 4}", ready=rng.random() > 0.1)
            event = PodObserved(namespace="default", name=f"web-{i}", observed_at=1.0, pod=pod)
            await bus.publish(subjects.cluster_pod("default", f"web-{i}"), msgspec.json.encode(event), msg_id=f"p{i}")

    async def load(bus: JetStreamBus, step: int) -> None:
        if step % 2:
            return
        name = f"job-{step // 2}"
        # 20 jobs on the first 10 pods: at least 10 are refused at intake (their pod has a job already), so every
        # seed makes enough decisions. Drawn from all 20, a seed with 2+ unready pods (no pass: maxUnavailable 2) and
        # few repeated pods made 3 (seed 777403207)
        job = migration_support.job(name, f"web-{rng.randrange(replicas // 2)}", created=created)
        event = mev.MigrationRequested(job=job, source="api", actor="faults", time=dt.datetime.now(dt.UTC))
        await bus.publish(subjects.MIGRATION_REQUESTS, mev.encode_migration_event(event), msg_id=name)

    async def decisions(bus: JetStreamBus) -> Decisions:
        # Each job's outcome must be stored once: a job passed (or rejected) twice is a decision duplicated.
        out: Decisions = []
        for message in await stream_messages(bus, streams.KOORD_MIGRATION, subjects.MIGRATION_ARBITER):
            event = mev.decode_migration_event(message.data)
            assert isinstance(event, mev.MigrationRound)
            out += [(d.job, d.outcome) for d in event.decisions if d.outcome != "waiting"]
        return out

    async def projection(bus: JetStreamBus, engine: AsyncEngine | None) -> Any:
        assert engine is not None
        store = MigrationStore(engine)
        jobs = await store.jobs()
        return jobs, [await store.trail(j.name) for j in jobs]

    return Case(
        service="migration",
        durables=(
            (streams.KOORD_MIGRATION, migration_service.EVENTS_CONSUMER),
            (streams.KOORD_CLUSTER, migration_service.CLUSTER_CONSUMER),
            (streams.KOORD_MIGRATION, migration_service.PROJECTOR_CONSUMER),
        ),
        decision_streams=(streams.KOORD_MIGRATION,),
        setup=setup,
        load=load,
        read_decisions=decisions,
        read_projection=projection,
        min_decisions=5,
        steps=steps,
    )


BUILDERS: dict[str, Callable[..., Case]] = {
    "migration": migration_case,
    "quota": quota_case,
    "nodemetric": nodemetric_case,
    "noderesource": noderesource_case,
    "slo": slo_case,
}
SERVICES = list(BUILDERS)


def build(service: str, rng: random.Random, **options: Any) -> Case:
    """`options`: the builders' keywords — `prefix` of the node names (distinct per case when several services run
    on one cluster), `steps` of load (each builder's load takes any number), for slo `configmap`."""
    return BUILDERS[service](rng, **options)
