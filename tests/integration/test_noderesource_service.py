"""The noderesource service on a bus: cluster state and NodeMetrics in, NodeResourceComputed decisions out.

Most cases run on MemoryBus; one runs the worked example and a restart on a real nats-server. Inputs are the §2.6
worked example (see tests/unit/test_noderesource_state.py), which decides batch-cpu 25000 and batch-memory 146 GiB.
The service clock is injected, so degrading after degradeTimeMinutes needs no waiting.
"""

from __future__ import annotations

from typing import Any

import msgspec
from prometheus_client import CollectorRegistry

from bus import streams, subjects
from bus.api import Bus
from bus.jetstream import JetStreamBus
from bus.memory import MemoryBus
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from services.common.metrics import new_registry
from services.noderesource import core
from services.noderesource.service import NodeResourceService
from services.noderesource.settings import NodeResourceSettings
from tests.support.events import publish_events as publish
from tests.support.waiting import eventually
from tests.unit.test_noderesource_state import GI, NODE, T0, config_event, metric_event, node_event, pod_event

BATCH_CPU, BATCH_MEMORY = core.BATCH_RESOURCES


async def worked_example(bus: Bus) -> None:
    await publish(
        bus,
        config_event(),
        node_event(),
        pod_event("a", "40", "100Gi"),
        pod_event("b", "20", "40Gi"),
        pod_event("batch", "10", "10Gi", priority="koord-batch"),
        metric_event(),
    )


async def latest(bus: Bus, node: str = NODE) -> NodeResourceComputed | None:
    stored = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed(node))
    return None if stored is None else NODERESOURCE_COMPUTED_DECODER.decode(stored.data)


async def stored_decisions(bus: Bus) -> int:
    count, _ = await bus.stream_info(streams.KOORD_NODERESOURCE)
    return count


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def memory_bus_with_streams(bus: MemoryBus) -> MemoryBus:
    await bus.ensure_streams(streams.all_streams())
    return bus


REGISTRIES: dict[NodeResourceService, CollectorRegistry] = {}


def service(bus: Bus, clock: Clock, **settings: Any) -> NodeResourceService:
    registry = new_registry()
    svc = NodeResourceService(
        bus, NodeResourceSettings(startup_timeout_seconds=10, **settings), registry=registry, clock=clock
    )
    REGISTRIES[svc] = registry
    return svc


def metric(svc: NodeResourceService, name: str, labels: dict[str, str] | None = None) -> float:
    return REGISTRIES[svc].get_sample_value(name, labels or {}) or 0.0


# --- MemoryBus


async def test_the_worked_example_is_decided_and_published(memory_bus: MemoryBus) -> None:
    bus = await memory_bus_with_streams(memory_bus)
    await worked_example(bus)
    svc = service(bus, Clock(T0 + 30))
    await svc.start()
    try:
        decision = await latest(bus)
        assert decision is not None
        assert decision.outcome == "computed"
        assert decision.resources[BATCH_CPU] == 25_000 and decision.resources[BATCH_MEMORY] == 146 * GI
        assert decision.computed_at == T0 and decision.write_due
        assert decision.trigger == ("node", "nodemetric", "pods")  # the config came before any node
        assert await stored_decisions(bus) == 1  # the start-up replay decided the node once
        assert metric(svc, "koordbus_noderesource_writes_due_total") == 1

        # Following new events: prod pod B reports 10 cores used, under its 20-core request: 25000 → 35000.
        bigger = msgspec.structs.replace(
            metric_event(at=T0 + 60),
            status=msgspec.structs.replace(
                metric_event().status,
                update_time=T0 + 60,
                pods_metric=[
                    *metric_event().status.pods_metric,
                    msgspec.structs.replace(metric_event().status.pods_metric[0], name="b"),
                ],
            ),
        )
        await publish(bus, bigger)
        await eventually(lambda: stored_decisions_is(bus, 2))
        second = await latest(bus)
        assert second is not None and second.trigger == ("nodemetric",) and second.computed_at == T0 + 60
        assert second.resources[BATCH_CPU] == 35_000 and second.write_due
    finally:
        await svc.stop()


async def stored_decisions_is(bus: Bus, count: int) -> bool:
    return await stored_decisions(bus) == count


async def test_a_stale_nodemetric_degrades_the_node_on_the_resync_tick(memory_bus: MemoryBus) -> None:
    bus = await memory_bus_with_streams(memory_bus)
    await worked_example(bus)
    clock = Clock(T0 + 30)
    svc = service(bus, clock, resync_interval_seconds=0.05)
    await svc.start()
    try:
        assert (await latest(bus)) is not None
        clock.now = T0 + 4 * 60  # fresh, and no write due yet: the resync decides the same, nothing is published
        await eventually(lambda: metric(svc, "koordbus_noderesource_decisions_unchanged_total") >= 1)
        assert await stored_decisions(bus) == 1
        clock.now = T0 + 15 * 60 + 1  # degradeTimeMinutes (15) after the NodeMetric's report time
        await eventually(lambda: stored_decisions_is(bus, 2))
        decision = await latest(bus)
        assert decision is not None and decision.outcome == "degraded" and decision.trigger == ("resync",)
        assert decision.resources[BATCH_CPU] is None and decision.write_due
        assert decision.computed_at == T0 + 15 * 60 + 1
        # the service records what it published once the publish is acknowledged: a reader of the stream may see the
        # decision before that
        await eventually(lambda: metric(svc, "koordbus_noderesource_degraded_nodes") == 1)
    finally:
        await svc.stop()


async def test_the_resync_tick_skips_nodes_decided_within_half_an_interval(memory_bus: MemoryBus) -> None:
    bus = await memory_bus_with_streams(memory_bus)
    await worked_example(bus)
    clock = Clock(T0 + 30)
    svc = service(bus, clock, resync_interval_seconds=3600)  # the tick never fires by itself here
    await svc.start()
    try:
        decided = metric(svc, "koordbus_noderesource_recomputations_total")
        assert decided >= 1
        await svc.resync()  # just decided: nothing to do
        assert metric(svc, "koordbus_noderesource_recomputations_total") == decided
        clock.now = T0 + 30 + 1800  # half the interval later: quiet long enough to be decided again
        await svc.resync()
        assert metric(svc, "koordbus_noderesource_recomputations_total") == decided + 1
    finally:
        await svc.stop()


async def test_a_config_change_recomputes_every_node(memory_bus: MemoryBus) -> None:
    bus = await memory_bus_with_streams(memory_bus)
    await worked_example(bus)
    await publish(bus, node_event("node-b"), metric_event("node-b"))
    svc = service(bus, Clock(T0 + 30))
    await svc.start()
    try:
        assert await stored_decisions(bus) == 2
        await publish(bus, config_event({"enable": True, "cpuReclaimThresholdPercent": 70}, rv="2"))
        await eventually(lambda: stored_decisions_is(bus, 4))
        for node, batch_cpu in ((NODE, 35_000), ("node-b", 55_000)):  # node-b: pods a and c are dangling
            decision = await latest(bus, node)
            assert decision is not None and decision.trigger == ("config",)
            assert decision.resources[BATCH_CPU] == batch_cpu and decision.write_due
    finally:
        await svc.stop()


async def test_a_restart_rebuilds_state_and_republishes_nothing(memory_bus: MemoryBus) -> None:
    bus = await memory_bus_with_streams(memory_bus)
    await worked_example(bus)
    first = service(bus, Clock(T0 + 30))
    await first.start()
    await first.stop()
    assert await stored_decisions(bus) == 1

    second = service(bus, Clock(T0 + 60))
    await second.start()
    try:
        assert second.ready and await stored_decisions(bus) == 1
        assert second.state.pods_by_node[NODE] == {"default/a", "default/b", "default/batch"}
        assert metric(second, "koordbus_noderesource_decisions_unchanged_total") == 1
        # The hysteresis baseline came back from the stream: a small change is published but is not a due write.
        await publish(bus, metric_event(at=T0 + 90, system_cores=5))
        await eventually(lambda: stored_decisions_is(bus, 2))
        decision = await latest(bus)
        assert decision is not None and decision.resources[BATCH_CPU] == 23_000
        assert not decision.write_due and decision.last_write_at == T0
    finally:
        await second.stop()


async def test_bad_and_unusable_inputs_are_dead_lettered_or_counted(memory_bus: MemoryBus) -> None:
    bus = await memory_bus_with_streams(memory_bus)
    await worked_example(bus)
    svc = service(bus, Clock(T0 + 30))
    await svc.start()
    try:
        await bus.publish(subjects.cluster_pod("default", "broken"), b'{"type": "nonsense"}', msg_id="broken")
        await publish(bus, pod_event("stray", "1", "1Gi", node="node-unknown"))
        await publish(bus, node_event(rv="0"))  # older than the node held (rv 1)
        for consumer in svc.consumers:
            assert await consumer.wait_idle(5)
        count, _ = await bus.stream_info(streams.KOORD_DLQ)
        assert count == 1
        skipped = "koordbus_noderesource_skipped_inputs_total"
        assert metric(svc, skipped, {"reason": "unknown_node"}) == 1
        assert metric(svc, skipped, {"reason": "stale_resource_version"}) == 1
        assert await stored_decisions(bus) == 1
    finally:
        await svc.stop()


async def test_nothing_is_decided_without_config_until_the_replay_ends(memory_bus: MemoryBus) -> None:
    bus = await memory_bus_with_streams(memory_bus)
    await publish(bus, node_event(), metric_event())
    svc = service(bus, Clock(T0 + 30))
    await svc.start()
    try:
        decision = await latest(bus)  # no ConfigMap in the stream: Koordinator's defaults, colocation disabled
        assert (
            decision is not None
            and decision.outcome == "disabled"
            and decision.trigger == ("config", "node", "nodemetric")
        )
        await publish(bus, config_event())
        await eventually(lambda: stored_decisions_is(bus, 2))
        enabled = await latest(bus)
        assert enabled is not None and enabled.outcome == "computed"
    finally:
        await svc.stop()


# --- a real nats-server


async def test_on_nats_the_worked_example_is_decided_once_across_a_restart(koordbus_bus: JetStreamBus) -> None:
    bus = koordbus_bus
    await worked_example(bus)
    first = service(bus, Clock(T0 + 30))
    await first.start()
    try:
        decision = await latest(bus)
        assert decision is not None
        assert decision.resources[BATCH_CPU] == 25_000 and decision.resources[BATCH_MEMORY] == 146 * GI
    finally:
        await first.stop()
    second = service(bus, Clock(T0 + 60))
    await second.start()
    try:
        assert await stored_decisions(bus) == 1
        await publish(bus, pod_event("b", "20", "40Gi", rv="2", deleted=True))  # its 20-core request goes
        await eventually(lambda: stored_decisions_is(bus, 2))
        decision = await latest(bus)
        assert decision is not None and decision.trigger == ("pods",)
        assert decision.resources[BATCH_CPU] == 45_000 and decision.write_due
    finally:
        await second.stop()


async def test_on_nats_a_decision_made_without_another_replicas_is_refused_and_decided_again(
    koordbus_bus: JetStreamBus,
) -> None:
    """Two replicas briefly both owning a node (a partition moving): the other one published a decision this one
    never read. This one's next decision of the node, built on the older view, must not go out over it: the stream
    refuses it (it expects the subject's last sequence it knows), the service reads the other's back and decides
    again from it — here to the same effect, so nothing more is published (the failover run's "decisions
    republished unchanged", seed 1013679065)."""
    bus = koordbus_bus
    await worked_example(bus)
    svc = service(bus, Clock(T0 + 30))
    await svc.start()
    try:
        first = await latest(bus)
        assert first is not None and first.write_due and first.resources[BATCH_CPU] == 25_000
        # What this service will decide for a small change at T0 + 90 (23000, inside the hysteresis: no write due),
        # as another replica decided it with an older baseline (a write due): same effect, another msg id.
        theirs = msgspec.structs.replace(
            first,
            computed_at=T0 + 90,
            trigger=("nodemetric",),
            resources={**first.resources, BATCH_CPU: 23_000},
            annotations={key: value.replace('"25k"', '"23k"') for key, value in first.annotations.items()},
            write_due=True,
            write_reason="another replica's",
            last_write_at=None,
            last_write_resources={},
        )
        await bus.publish(subjects.noderesource_computed(NODE), msgspec.json.encode(theirs), msg_id="theirs")
        await publish(bus, metric_event(at=T0 + 90, system_cores=5))
        await eventually(lambda: refused_is(svc, 1))
        for consumer in svc.consumers:
            assert await consumer.wait_idle(5)
        assert await stored_decisions(bus) == 2  # the worked example's and theirs: none over it
        assert svc.last_decision(NODE) == theirs

        # The next change builds on theirs: its baseline (a write at T0 + 90 of 23000) is the one compared with.
        await publish(bus, pod_event("b", "20", "40Gi", rv="2", deleted=True))
        await eventually(lambda: stored_decisions_is(bus, 3))
        decision = await latest(bus)
        assert decision is not None and decision.resources[BATCH_CPU] == 43_000
        assert decision.write_due and decision.last_write_at == T0 + 90
        assert metric(svc, "koordbus_noderesource_decisions_refused_total") == 1
    finally:
        await svc.stop()


async def refused_is(svc: NodeResourceService, count: int) -> bool:
    return metric(svc, "koordbus_noderesource_decisions_refused_total") == count
