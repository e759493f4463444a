"""The simulation's closed loop over many report rounds, through the real services: simulated nodes publish their
batches (koordbus.simulation.publish_window) to a real nats-server, the nodemetric service reports NodeMetrics, the
noderesource service decides each node's batch allocatable from them, and the simulation follows those decisions
(follow_batch_allocatable) — for 40 report rounds. In every window of every node the batch pods' requests and their
usage at each second stay at or under the batch allocatable the node had when the window began, while that allocatable
moves and running pods are evicted.

Event time is a fixed day of 2023 run forward as fast as the services answer: they judge freshness by the events' own
times (nodemetric reports by window time, noderesource decides for the NodeMetric's report time; its clock, used for
resyncs, is the simulation's), and the test waits at each report boundary until every node follows the decision made
for it, so the run is the same every time. About 15 s here.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from agent.actuate import NodePod
from agent.batch import PodListThinner
from agent.simulate import SimulatedNode, simulated_node_names
from bus import streams, subjects
from bus.jetstream import JetStreamBus
from koordbus import simulation
from schemas import vocab
from schemas.node import NodeMetricsReported
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from services.common import db
from services.common.metrics import new_registry
from services.nodemetric.service import NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore
from services.noderesource.service import NodeResourceService
from services.noderesource.settings import NodeResourceSettings
from tests.support import batches as wire
from tests.support.waiting import eventually

pytestmark = pytest.mark.timeout(110)

ROUNDS = 40
REPORT = 60  # NodeMetric report interval, seconds of event time
WINDOW = 10  # the simulation's publish interval
START = 1_700_042_400.0
"""10:00 UTC of a day: the simulated online load rises towards its mid-afternoon peak, so the batch allocatable
shrinks round after round and running batch pods have to be evicted (deterministic: same seeds, same event times)."""


@dataclass(frozen=True)
class Window:
    start: float
    allocatable: tuple[float, int] | None
    batch: NodeMetricsReported
    listed: list[NodePod]


class WatchedNode(SimulatedNode):
    """A simulated node that keeps each window it built with the batch allocatable it was built under."""

    def __init__(self, name: str, seed: int) -> None:
        super().__init__(name, seed, pods=40)
        self.windows: list[Window] = []

    def agent_batch(self, window_start: float, window_end: float) -> tuple[NodeMetricsReported, list[NodePod]]:
        allocatable = self.batch_allocatable
        batch, listed = super().agent_batch(window_start, window_end)
        self.windows.append(Window(window_start, allocatable, batch, listed))
        return batch, listed


def is_batch(node_pod: NodePod) -> bool:
    return node_pod.pod.metadata.labels.get(vocab.PRIORITY_CLASS_LABEL) == vocab.PRIORITY_BATCH


def over(window: Window) -> list[str]:
    """What in `window` exceeds its batch allocatable: the batch pods' requests, or their usage at some second."""
    assert window.allocatable is not None
    cpu_allocatable = round(window.allocatable[0] * 1000)
    memory_allocatable = window.allocatable[1]
    batch_pods = [p for p in window.listed if is_batch(p)]
    requests = [p.pod.spec.containers[0].resources.requests or {} for p in batch_pods]
    cpu_requested = sum(int(r[vocab.BATCH_CPU]) for r in requests)
    memory_requested = sum(int(r[vocab.BATCH_MEMORY]) for r in requests)
    found = []
    if cpu_requested > cpu_allocatable or memory_requested > memory_allocatable:
        found.append(
            f"{window.start:.0f}: {len(batch_pods)} batch pods request {cpu_requested}m / {memory_requested} B, "
            f"allocatable {cpu_allocatable}m / {memory_allocatable} B"
        )
    per_second: dict[float, list[float]] = {}
    for ref, samples in wire.samples_by_pod(window.batch):
        if ref.labels.get(vocab.PRIORITY_CLASS_LABEL) == vocab.PRIORITY_BATCH:
            for t, cpu, memory in samples:
                used = per_second.setdefault(t, [0.0, 0.0])
                used[0] += cpu * 1000
                used[1] += memory
    found += [
        f"{t:.0f}: batch pods use {cpu:.1f}m / {memory:.0f} B, allocatable {cpu_allocatable}m / {memory_allocatable} B"
        for t, (cpu, memory) in sorted(per_second.items())
        if cpu > cpu_allocatable or memory > memory_allocatable
    ]
    return found


async def test_over_many_report_rounds_batch_pods_stay_within_the_decided_allocatable(
    koordbus_bus: JetStreamBus, tmp_path: Path
) -> None:
    bus = koordbus_bus
    await bus.ensure_streams(streams.all_streams())
    url = f"sqlite:///{tmp_path / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    nodes = [WatchedNode(name, seed=7 + i) for i, name in enumerate(simulated_node_names(3))]
    start = START
    now = [start]
    metrics = NodeMetricService(
        bus,
        NodeMetricStore(engine),
        NodeMetricSettings(report_interval_seconds=REPORT, report_phase_step_seconds=0),
        registry=new_registry(),
    )
    resources = NodeResourceService(
        bus,
        NodeResourceSettings(startup_timeout_seconds=2, resync_interval_seconds=3600),
        registry=new_registry(),
        clock=lambda: now[0],
    )
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(engine.dispose)
        for service in (metrics, resources):
            await service.start()
            stack.push_async_callback(service.stop)
        await simulation.publish_cluster(bus, nodes, at=start)  # the Nodes, and colocation on
        await simulation.publish_states(bus, nodes, at=start)
        for node in nodes:
            node.set_batch_allocatable(0.0, 0)  # the loop closed, as run_simulation closes it
        follow = asyncio.create_task(simulation.follow_batch_allocatable(bus, nodes, since=time.time() - 5))
        stack.callback(follow.cancel)
        thinners: dict[str, PodListThinner] = {}
        decided: dict[str, list[tuple[float, float, int]]] = {n.name: [] for n in nodes}

        async def latest(node: WatchedNode) -> NodeResourceComputed | None:
            stored = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed(node.name))
            return None if stored is None else NODERESOURCE_COMPUTED_DECODER.decode(stored.data)

        async def followed(boundary: float) -> bool:
            """Every node decided for the NodeMetric reported at `boundary` and follows that decision."""
            for node in nodes:
                decision = await latest(node)
                if decision is None or decision.computed_at < boundary or "nodemetric" not in decision.trigger:
                    return False
                if node.batch_allocatable != simulation.batch_allocatable(decision):
                    return False
            for node in nodes:
                assert node.batch_allocatable is not None
                decided[node.name].append((boundary, *node.batch_allocatable))
            return True

        window = start
        reported = 0
        while reported < ROUNDS:
            now[0] = window + WINDOW
            await simulation.publish_window(bus, nodes, window, window + WINDOW, thinners=thinners)
            window += WINDOW
            if window % REPORT == 0 and window - start >= 2 * REPORT:  # reports once the window holds a minute
                await eventually(functools.partial(followed, window), timeout=15)
                reported += 1
        evictions = await bus.read_recent(streams.KOORD_NODE, subjects.NODE_EVICTION_ALL, since=0, limit=10_000)
    problems = [f"{node.name} {line}" for node in nodes for w in node.windows if w.allocatable for line in over(w)]
    assert not problems, "\n".join(problems[:20])
    # the loop was alive: allocatable moved with the load, batch pods ran within it
    moved = {name: len({(cpu, memory) for _, cpu, memory in rounds}) for name, rounds in decided.items()}
    assert all(count > 1 for count in moved.values()), moved
    ran = sum(1 for node in nodes for w in node.windows if w.allocatable and any(map(is_batch, w.listed)))
    assert ran > len(nodes) * ROUNDS, f"batch pods ran in only {ran} windows"
    assert evictions, "no batch pod was evicted: the allocatable never shrank below what ran"
