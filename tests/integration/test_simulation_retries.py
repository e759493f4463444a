"""The simulation's start-up publishes survive a failing bus (issue #19, point 3).

Under load a publish timed out while `koordbus up --simulate-nodes 1000` backfilled its history, and the whole
simulation ended there: no more reports, for good. Its one-off publishes (the cluster's nodes, the node states, each
backfill window) are now retried with backoff; the live loop already skips a window it cannot publish.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from bus import streams
from bus.api import PublishAck
from bus.errors import BusUnavailableError
from bus.memory import MemoryBus
from koordbus import simulation
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
    bus = FlakyBus(failing={1, 2, 4})  # the first backfill window twice, the second once
    await bus.ensure_streams(streams.all_streams())
    nodes = simulation.make_nodes(2, pods_per_node=1)
    now = 100_000 * INTERVAL + 0.001  # a window just begun, and a clock that stands still: the live loop's first
    # window is ~10 s away, past the backfill's 2 s of retries
    run = asyncio.create_task(
        simulation.run_simulation(bus, nodes, interval=INTERVAL, backfill_seconds=3 * INTERVAL, clock=lambda: now)
    )
    try:
        await eventually(lambda: len(bus.published) >= 4, timeout=20)  # the states and the three windows
        assert bus.attempts == 7 and not run.done()
        assert bus.published[0] == len(nodes)  # one state per node, then each window's batches
    finally:
        await cancel_and_wait(run)
