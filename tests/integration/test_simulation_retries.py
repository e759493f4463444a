"""The simulation's start-up publishes survive a failing bus (issue #19, point 3).

Under load a publish timed out while `koordbus up --simulate-nodes 1000` backfilled its history, and the whole
simulation ended there: no more reports, for good. Its one-off publishes (the cluster's nodes, the node states, each
backfill window) are now retried with backoff; the live loop already skips a window it cannot publish. The node
topologies are published at start too, and again every refresh, as a real agent does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bus import streams, subjects
from bus.api import PublishAck
from bus.errors import BusUnavailableError
from bus.memory import MemoryBus
from koordbus import simulation
from schemas.node_topology import TOPOLOGY_DECODER, NodeTopologyReported
from services.common.tasks import cancel_and_wait
from tests.support.waiting import eventually

INTERVAL = 10.0


class FlakyBus(MemoryBus):
    """A bus on which the batch publishes numbered in `failing` (from 0) time out (nothing of them is stored)."""

    def __init__(self, failing: set[int]) -> None:
        super().__init__()
        self.failing = failing
        self.attempts = 0
        self.published: list[int] = []
        """The size of each batch publish that went through."""

    async def publish_many(self, messages: Sequence[tuple[str, bytes, str]]) -> list[PublishAck]:
        attempt, self.attempts = self.attempts, self.attempts + 1
        if attempt in self.failing:
            raise BusUnavailableError(f"publish of {len(messages)} messages: TimeoutError")
        acks = await super().publish_many(messages)
        self.published.append(len(messages))
        return acks


async def test_the_backfill_goes_on_after_publishes_time_out() -> None:
    bus = FlakyBus(
        failing={2, 3, 5}
    )  # after the states and topologies: the first backfill window twice, the second once
    await bus.ensure_streams(streams.all_streams())
    nodes = simulation.make_nodes(2, pods_per_node=1)
    now = 100_000 * INTERVAL + 0.001  # a window just begun, and a clock that stands still: the live loop's first
    # window is ~10 s away, past the backfill's 2 s of retries
    run = asyncio.create_task(
        simulation.run_simulation(bus, nodes, interval=INTERVAL, backfill_seconds=3 * INTERVAL, clock=lambda: now)
    )
    try:
        await eventually(lambda: len(bus.published) >= 5, timeout=20)  # states, topologies and the three windows
        assert bus.attempts == 8 and not run.done()
        assert bus.published[:2] == [len(nodes), len(nodes)]  # one state, one topology per node; then the windows
    finally:
        await cancel_and_wait(run)


async def test_the_node_topologies_are_published_at_start_and_at_every_refresh() -> None:
    bus = MemoryBus()
    await bus.ensure_streams(streams.all_streams())
    nodes = simulation.make_nodes(2, pods_per_node=1)
    start = 100_000 * INTERVAL + 0.001
    now = [start]
    stop_at = start + simulation.TOPOLOGY_REFRESH_SECONDS + 5 * INTERVAL

    async def sleep(seconds: float) -> None:
        """Time passes as the simulation sleeps, until `stop_at`, where it stands still for good."""
        if now[0] + seconds > stop_at:
            await asyncio.Event().wait()
        now[0] += seconds
        await asyncio.sleep(0)

    async def topology(node: str) -> NodeTopologyReported | None:
        stored = await bus.last_on_subject(streams.KOORD_NODE, subjects.stored(subjects.node_topology(node)))
        return None if stored is None else TOPOLOGY_DECODER.decode(stored.data)

    async def all_at(at: float) -> bool:
        return [getattr(await topology(n.name), "at", None) for n in nodes] == [at, at]

    run = asyncio.create_task(
        simulation.run_simulation(bus, nodes, interval=INTERVAL, clock=lambda: now[0], sleep=sleep)
    )
    try:
        await eventually(lambda: now[0] + INTERVAL > stop_at, timeout=60)
        # refreshed once, at the end of the first window a refresh after the start
        refreshed = (100_000 + simulation.TOPOLOGY_REFRESH_SECONDS // INTERVAL + 1) * INTERVAL
        assert await all_at(refreshed)
        report = await topology(nodes[0].name)
        assert report is not None and report.problems == []
        assert sum(z.cpu_count for z in report.zones) == nodes[0].cpu_cores
    finally:
        await cancel_and_wait(run)
