"""A stop signal quiets every consumer of the process's bus at once (koordbus.runtime.Stop.on_stop, wired by
open_bus), on a real nats-server.

`koordbus up --simulate-nodes 1000` missed its shutdown deadline (exit 1) because the nodemetric ingest kept working
through its backlog while the services were stopped one by one. Now, the moment the stop is set, each consumer
finishes the message in hand and takes no more: what it had fetched goes back to the stream at once.
"""

from __future__ import annotations

import asyncio
from contextlib import AsyncExitStack

from bus.api import Delivery
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
        in_hand = asyncio.Event()
        stopped = asyncio.Event()

        def hold_the_first(delivery: Delivery) -> None:
            in_hand.set()

        held = Recorder(hold_the_first)
        original = held.handle

        async def handle(delivery: Delivery) -> None:
            await original(delivery)
            if len(held.seen) == 1:
                await stopped.wait()  # the stop comes while the first message of a batch is in hand

        held.handle = handle  # type: ignore[method-assign]
        consumer = bus.consume(names.consumer(batch_size=50, ack_wait_seconds=30.0), held)
        await in_hand.wait()
        stop.set()  # no consumer.stop(): the stop signal alone quiets every consumer of the process's bus
        stopped.set()
        await wait_until(lambda: consumer.stopped)
        # the one in hand finished and settled; whatever else its fetch held went back, not worked through
        assert len(held.seen) == 1 and held.committed == held.seen
        assert consumer.stats.delivered == 1


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
