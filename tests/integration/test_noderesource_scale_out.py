"""Two noderesource replicas on one real nats-server and one database: the node partitions (KOORD_NODEMETRIC's
subject transform) are split so every node is decided by exactly one replica, a move publishes no decision twice,
and a replica that dies hands its partitions to the other, which replays those nodes' state and decides the
NodeMetrics the dead one never got to — each exactly once, and each projected into the database once."""

from __future__ import annotations

import logging
import time
from collections import Counter
from pathlib import Path

import pytest

from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from services.common import db
from services.common.metrics import new_registry
from services.noderesource.service import NodeResourceService
from services.noderesource.settings import NodeResourceSettings
from services.noderesource.store import NodeResourceStore
from tests.support.events import publish_events
from tests.support.waiting import eventually
from tests.unit.test_noderesource_state import config_event, metric_event, node_event, pod_event

NODES = [f"worker-{i}" for i in range(12)]


def replica(bus: JetStreamBus, store: NodeResourceStore, instance: str) -> NodeResourceService:
    settings = NodeResourceSettings(instance=instance, membership_ttl_seconds=4.0, startup_timeout_seconds=10)
    return NodeResourceService(bus, settings, registry=new_registry(), store=store)


async def publish_metrics(bus: JetStreamBus, at: float, *, system_cores: float) -> None:
    """A NodeMetric per node; each system usage gives every node a different batch-cpu, so each is published."""
    await publish_events(bus, *(metric_event(n, at=at, system_cores=system_cores) for n in NODES))


async def decisions(bus: JetStreamBus) -> list[NodeResourceComputed]:
    stored = await bus.read_recent(streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_COMPUTED_ALL, since=0, limit=1000)
    return [NODERESOURCE_COMPUTED_DECODER.decode(d.data) for d in stored]


def held(*replicas: NodeResourceService) -> str:
    """What each replica holds, for a failure's message (the rare one of this test went unexplained)."""
    return "; ".join(
        f"{r.settings.instance}: owned {sorted(r.owned or ())}, settled {sorted(r._settled or ())}, "
        f"{len(r.state.nodes)} nodes, follower {'running' if r._follower and not r._follower.done() else 'stopped'}"
        for r in replicas
    )


async def test_replicas_split_the_nodes_and_a_dead_replicas_partitions_move(
    tmp_path: Path, koordbus_bus: JetStreamBus, caplog: pytest.LogCaptureFixture
) -> None:
    for name in ("services.noderesource", "services.common.membership"):  # the moves, in a failure's report
        caplog.set_level(logging.INFO, logger=name)
    url = f"sqlite:///{tmp_path / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    store = NodeResourceStore(engine)
    bus = koordbus_bus
    start = time.time() - 60
    await publish_events(
        bus,
        config_event(),
        *(node_event(n) for n in NODES),
        *(pod_event(f"{n}-prod", "40", "100Gi", node=n) for n in NODES),
    )
    await publish_metrics(bus, start, system_cores=3)
    first, second = replica(bus, store, "r1"), replica(bus, store, "r2")
    try:
        await first.start()
        assert first.owned == frozenset(range(subjects.NODE_PARTITIONS))  # alone: every partition
        assert {d.node for d in await decisions(bus)} == set(NODES)
        await second.start()

        def split() -> bool:
            a, b = first.owned or frozenset(), second.owned or frozenset()
            return (
                not a & b
                and len(a | b) == subjects.NODE_PARTITIONS
                and set(first.state.nodes).isdisjoint(second.state.nodes)
                and set(first.state.nodes) | set(second.state.nodes) == set(NODES)
            )

        await eventually(split, timeout=20, state=lambda: held(first, second))
        assert first.owned and second.owned and first.state.nodes and second.state.nodes  # both hold a share
        for holder in (first, second):  # a replica holds exactly the nodes of its partitions
            assert {subjects.node_partition(n) for n in holder.state.nodes} <= (holder.owned or set())
        assert len(await decisions(bus)) == len(NODES)  # the second replica's start republished nothing unchanged
        # a replica's own durables go away an hour after it does (pod names change with every pod)
        info = await bus.jetstream.consumer_info(streams.KOORD_NODEMETRIC, "noderesource-nodemetric-r2")
        assert info.config.inactive_threshold == 3600.0
        assert set(info.config.filter_subjects or [info.config.filter_subject]) == set(
            subjects.partition_filters(subjects.NODEMETRIC_COMPUTED_ALL, second.owned)
        )

        # New NodeMetrics: each node is decided by the replica owning its partition, and by no other.
        await publish_metrics(bus, start + 20, system_cores=4)

        def decided(at: float) -> bool:
            return all(
                (decision := first.last_decision(n) or second.last_decision(n)) is not None
                and decision.computed_at == at
                for n in NODES
            )

        await eventually(lambda: decided(start + 20), timeout=20)
        for node in NODES:
            owner, other = (first, second) if node in first.state.nodes else (second, first)
            assert subjects.node_partition(node) in (owner.owned or ())
            assert other.last_decision(node) is None

        # The second replica dies (no farewell) and NodeMetrics arrive before anyone noticed: after the TTL its
        # partitions move, and the first replays those nodes' state and decides the NodeMetrics nobody consumed.
        moved = set(second.state.nodes)
        second._membership = None  # as if killed: it never says goodbye
        await second.stop()
        await publish_metrics(bus, start + 40, system_cores=5)
        await eventually(
            lambda: first.owned == frozenset(range(subjects.NODE_PARTITIONS)), timeout=20, state=lambda: held(first)
        )
        await eventually(lambda: moved <= set(first.state.nodes), timeout=20)

        async def all_decided() -> bool:
            return {d.node for d in await decisions(bus) if d.computed_at == start + 40} == set(NODES)

        await eventually(all_decided, timeout=20)
        published = await decisions(bus)
        assert Counter((d.node, d.computed_at) for d in published) == Counter(
            {(n, at): 1 for n in NODES for at in (start, start + 20, start + 40)}
        )  # every decision exactly once: none lost in the move, none published twice

        async def projected_once() -> bool:
            histories = [await store.history(n, limit=10) for n in NODES]
            return sorted(len(h) for h in histories) == [3] * len(NODES)

        await eventually(projected_once, timeout=20)  # both replicas projected, each decision written once
    finally:
        await first.stop()
        await second.stop()
        await engine.dispose()
