"""A stop signal quiets every consumer of the process's bus at once (koordbus.runtime.Stop.on_stop, wired by
open_bus), on a real nats-server.

`koordbus up --simulate-nodes 1000` missed its shutdown deadline (exit 1) because the nodemetric ingest kept working
through its backlog while the services were stopped one by one. Now, the moment the stop is set, each consumer
finishes the message in hand and takes no more: what it had fetched goes back to the stream at once.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from koordbus import runtime
from tests.bus import Names, Recorder, wait_until


async def test_a_stop_quiets_the_consumers_before_the_services_are_stopped(nats_url: str) -> None:
    names = Names()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await runtime.open_bus(stack, nats_url, name="quieted", ensure_streams=False)
        await bus.ensure_streams([names.stream_spec(), names.dlq_spec()])
        for i in range(50):
            await bus.publish(names.subject("a"), f"m{i}".encode(), msg_id=f"m{i}")
        slow = Recorder(pause=0.05)
        consumer = bus.consume(names.consumer(batch_size=50, ack_wait_seconds=30.0), slow)
        await wait_until(lambda: len(slow.seen) >= 2)
        stop.set()
        handled = len(slow.seen)
        await wait_until(lambda: consumer.stats.naked > 0)  # the rest of its batch handed back, not worked through
        assert len(slow.seen) <= handled + 1 and slow.committed == slow.seen
        assert consumer.stats.naked == 50 - len(slow.seen)


async def test_a_task_cancelled_by_the_stop_finishes_its_cleanup() -> None:
    """A background task cancelled by the stop (cancel_on_stop) is not cancelled a second time when the stack
    closes: its `finally` (the simulated cluster closing its HTTPS clients) runs to the end. Cut short, an HTTPS
    client left open held the extender's graceful shutdown past its timeout (uvicorn's ERROR in up's log)."""
    cleaned: list[str] = []
    in_cleanup = asyncio.Event()

    async def simulation() -> None:
        try:
            await asyncio.Event().wait()
        finally:
            in_cleanup.set()
            await asyncio.sleep(0.2)  # closing connections takes a few round trips
            cleaned.append("closed")

    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        task = runtime.background(stack, simulation(), name="simulation", cancel_on_stop=True)
        await asyncio.sleep(0)
        stop.set()
        await in_cleanup.wait()
    assert task.cancelled() and cleaned == ["closed"]
