"""services.common.startup.wait_replayed on the MemoryBus: it waits out a slow replay that keeps moving and gives
up on one that stalls."""

from __future__ import annotations

import asyncio

from bus.memory import MemoryBus
from services.common.startup import wait_replayed
from tests.bus import Names, Recorder


async def _bus_with(names: Names, messages: int) -> MemoryBus:
    bus = MemoryBus()
    await bus.ensure_streams([names.stream_spec(), names.dlq_spec()])
    for i in range(messages):
        await bus.publish(names.subject("a"), f"m{i}".encode(), msg_id=f"a-{i}")
    return bus


async def test_a_replay_slower_than_the_stall_limit_is_waited_for_while_it_moves() -> None:
    names = Names()
    bus = await _bus_with(names, 20)
    rec = Recorder(pause=0.03)  # 20 × 30 ms = 0.6 s, three times the stall limit
    consumer = bus.consume(names.consumer(batch_size=2), rec)
    try:
        assert await wait_replayed(consumer, what="test", stall_seconds=0.2, check_every=0.05)
        assert len(rec.committed) == 20
    finally:
        await consumer.stop()


async def test_a_stalled_replay_gives_up_after_the_stall_limit() -> None:
    names = Names()
    bus = await _bus_with(names, 3)
    stuck = asyncio.Event()

    class Stuck(Recorder):
        async def handle(self, delivery: object) -> None:
            await stuck.wait()

    consumer = bus.consume(names.consumer(), Stuck())
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        assert not await wait_replayed(consumer, what="test", stall_seconds=0.3, check_every=0.05)
        assert 0.3 <= loop.time() - started < 2.0
    finally:
        stuck.set()
        await consumer.stop()
