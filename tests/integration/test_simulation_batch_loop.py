"""koordbus.simulation closes the loop over a real nats-server: each simulated node takes the batch allocatable of the
noderesource decisions published for it (NodeResourceComputed), and its batch pods then run within it; the pods it
evicts when that shrinks are published as the agent publishes its evictions, and the bridge's eviction executor and
the events API take them like real ones."""

from __future__ import annotations

import asyncio
import contextlib
import time

import httpx
import msgspec

from agent.simulate import GiB
from bus import streams, subjects
from bus.api import msg_id
from bus.jetstream import JetStreamBus
from koordbus import simulation
from schemas import vocab
from schemas.noderesource import NodeResourceComputed
from schemas.qos import EVICTION_DECODER
from services.common import auth
from services.common.metrics import new_registry
from services.common.tasks import cancel_and_wait
from services.k8s.eviction_executor import EvictionExecutor, RecordingEvictor
from tests.support import api_auth, live_api
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
        await cancel_and_wait(follow)
    # The simulated batch jobs run in bursts (periods of 30–120 minutes, about half of it on): the five minutes checked
    # start at the first window in which the node with room runs batch pods, not at the clock's (at some times of day
    # the node had no burst for five minutes and the test failed without a code change).
    window = (now // 10) * 10
    while not any(
        ref.labels.get(vocab.PRIORITY_CLASS_LABEL) == vocab.PRIORITY_BATCH
        for ref, _ in wire.samples_by_pod(nodes[0].batch(window, window + 10))
    ):
        assert window < now + 7200, "no batch pod ran in two hours"
        window += 10
    ran: set[str] = set()
    for k in range(30):  # five minutes of windows from there: bursts come and go
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


async def test_simulated_evictions_are_published_as_the_agents_and_taken_like_real_ones(
    koordbus_bus: JetStreamBus,
) -> None:
    bus = koordbus_bus
    await bus.ensure_streams(streams.all_streams())
    (node,) = simulation.make_nodes(1, pods_per_node=40)
    evictor = RecordingEvictor()
    executor = EvictionExecutor(bus, evictor, registry=new_registry())  # the bridge in record-only mode
    await executor.start()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(executor.stop)
        base = await live_api.serve_events_api(stack, bus)
        node.set_batch_allocatable(16.0, 64 * GiB)
        window = (time.time() // 10) * 10
        shrink = window
        while not any(  # windows on until one runs batch pods
            ref.labels.get(vocab.PRIORITY_CLASS_LABEL) == vocab.PRIORITY_BATCH
            for ref, _ in wire.samples_by_pod(node.batch(shrink, shrink + 10))
        ):
            assert node.last_evictions == () and shrink < window + 7200, "no batch pod ran in two hours"
            shrink += 10
        shrink += 10
        node.set_batch_allocatable(0.0, 0)
        await simulation.publish_window(bus, [node], shrink, shrink + 10)
        requests = node.last_evictions
        assert requests, "the shrink evicted nothing"
        stored = await bus.read_recent(
            streams.KOORD_NODE, subjects.stored(subjects.node_eviction(node.name)), since=0, limit=100
        )
        assert [EVICTION_DECODER.decode(d.data) for d in stored] == list(requests)

        def recorded() -> bool:
            return len(evictor.export()) == len(requests)

        await eventually(recorded)
        assert {(e["pod"], e["uid"], e["feature"]) for e in evictor.export()} == {
            (f"{r.namespace}/{r.name}", r.uid, r.feature) for r in requests
        }
        async with httpx.AsyncClient(headers=api_auth.headers(auth.VIEWER), timeout=10) as client:
            page = await client.get(
                f"{base}/api/v1/events", params={"type": "node.eviction", "node": node.name, "since": "0"}
            )
            assert page.status_code == 200, page.text
            events = page.json()["events"]
            assert [(e["type"], e["node"], e["namespace"]) for e in events] == [
                ("node.eviction", node.name, "batch") for _ in requests
            ]
            assert [e["data"] for e in events] == [msgspec.to_builtins(r) for r in requests]
            # the dashboard's node page: the eviction loops' actuations, as a real agent reports its evictions
            shown = await client.get(f"{base}/api/v1/nodes/{node.name}/actuations", params={"since": "0"})
        assert shown.status_code == 200, shown.text
        actuations = shown.json()["actuations"]
        assert sorted(a["loop"] for a in actuations) == sorted(
            {"CPUAllocatableEvict": "cpu-evict", "MemoryAllocatableEvict": "memory-evict"}[f]
            for f in {r.feature for r in requests}
        )
        changes = {c["path"]: c for a in actuations for c in a["changes"]}
        assert changes == {
            f"pods/{r.namespace}/{r.name}": {
                "path": f"pods/{r.namespace}/{r.name}",
                "before": "running",
                "after": "eviction requested",
                "reason": r.reason,
            }
            for r in requests
        }
        assert {(a["node"], a["at"], a["dry_run"]) for a in actuations} == {(node.name, shrink, False)}
