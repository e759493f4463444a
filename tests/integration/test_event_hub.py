"""The event hub's backpressure on the in-process bus: a subscriber that does not read is dropped with its reason
once its queue is full, while the others get every event and the publisher never waits."""

from __future__ import annotations

import asyncio
import json

from bus import streams, subjects
from bus.memory import MemoryBus
from services.api import event_catalogue as catalogue
from services.api.event_hub import EventHub, Message, Start
from tests.support.waiting import eventually


async def test_a_slow_subscriber_is_dropped_and_nobody_else_notices() -> None:
    bus = MemoryBus()
    await bus.ensure_streams(streams.all_streams())
    hub = EventHub(bus, queue_size=5)
    try:
        wanted = catalogue.parse_filter(["noderesource.computed"], {})
        slow = await hub.subscribe(wanted, caller="slow")
        reader = await hub.subscribe(wanted, caller="reader")
        got: list[Message] = []

        async def read() -> None:
            async for message in hub.events(reader, Start()):
                got.append(message)

        reading = asyncio.create_task(read())
        for n in range(40):
            await bus.publish(subjects.noderesource_computed(f"n{n}"), json.dumps({"n": n}).encode(), msg_id=f"{n}")
        await eventually(lambda: len(got) == 40)
        assert [json.loads(m.data)["data"]["n"] for m in got] == list(range(40))
        assert slow.dropped is not None and "slow client: 5 events queued" in slow.dropped
        # the slow one is told why at once, and its stream ends (it resumes from its last id, missing nothing)
        late = [m async for m in hub.events(slow, Start())]
        assert [m.kind for m in late] == ["dropped"]
        assert "slow client" in json.loads(late[-1].data)["reason"]
        assert hub.subscriptions == 1 and hub.dropped == 1
        reading.cancel()
        await asyncio.gather(reading, return_exceptions=True)
        assert hub.subscriptions == 0
    finally:
        await hub.close()
