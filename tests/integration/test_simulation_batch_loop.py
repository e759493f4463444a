"""koordbus.simulation closes the loop over a real nats-server: each simulated node takes the batch allocatable of the
noderesource decisions published for it (NodeResourceComputed), and its batch pods then run within it."""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec

from agent.simulate import GiB
from bus import streams, subjects
from bus.api import msg_id
from bus.jetstream import JetStreamBus
from koordbus import simulation
from schemas import vocab
from schemas.noderesource import NodeResourceComputed
from tests.support import batches as wire
from tests.support.waiting import eventually


def decision(node: str, at: float, cpu_milli: int | None, memory: int | None) -> NodeResourceComputed:
    return NodeResourceComputed(
        node=node,
        computed_at=at,
        trigger=("nodemetric",),
        outcome="computed",
        resources={vocab.BATCH_CPU: cpu_milli, vocab.BATCH_MEMORY: memory},
        write_due=True,
        write_reason="first write",
    )


async def test_simulated_nodes_follow_their_batch_allocatable(koordbus_bus: JetStreamBus) -> None:
    bus = koordbus_bus
    await bus.ensure_streams(streams.all_streams())
    nodes = simulation.make_nodes(2, pods_per_node=40)
    now = time.time()
    follow = asyncio.create_task(simulation.follow_batch_allocatable(bus, nodes, since=now - 1))
    try:
        for i, (cpu, memory) in enumerate([(3_500, 8 * GiB), (None, None)]):
            event = decision(nodes[i].name, now, cpu, memory)
            subject = subjects.noderesource_computed(nodes[i].name)
            await bus.publish(subject, msgspec.json.encode(event), msg_id=msg_id(nodes[i].name, "computed", now))

        async def decided() -> bool:
            return [n.batch_allocatable for n in nodes] == [(3.5, 8 * GiB), (0.0, 0)]

        await eventually(decided)
    finally:
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await follow
    window = (now // 10) * 10
    ran: set[str] = set()
    for k in range(30):  # five minutes of windows: bursts come and go
        for node, (cpu_limit, memory_limit) in zip(nodes, [(3.5, 8 * GiB), (0.0, 0)], strict=True):
            batch = node.batch(window + 10 * k, window + 10 * k + 10)
            per_second: dict[float, list[float]] = {}
            for ref, samples in wire.samples_by_pod(batch):
                if ref.labels.get(vocab.PRIORITY_CLASS_LABEL) == vocab.PRIORITY_BATCH:
                    ran.add(node.name)
                    for t, cpu, memory in samples:
                        used = per_second.setdefault(t, [0.0, 0.0])
                        used[0] += cpu
                        used[1] += memory
            assert all(cpu <= cpu_limit and memory <= memory_limit for cpu, memory in per_second.values())
    assert ran == {nodes[0].name}  # batch pods run where there is room for them, and only there
