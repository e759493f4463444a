"""The event hub's backpressure on the in-process bus: a subscriber that does not read is dropped with its reason
once its queue is full, while the others get every event and the publisher never waits."""

from __future__ import annotations

import asyncio
import contextlib
import json
from typing import Any

import pytest

from bus import streams, subjects
from bus.errors import BusUnavailableError
from bus.jetstream import JetStreamBus
from bus.memory import MemoryBus
from services.api import event_catalogue as catalogue
from services.api import event_hub
from services.api.event_hub import EventHub, Message, Start
from services.common.tasks import cancel_and_wait
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
        await cancel_and_wait(reading)
        assert hub.subscriptions == 0
    finally:
        await hub.close()


async def test_a_catch_up_that_waits_on_a_slow_server_misses_nothing(
    koordbus_bus: JetStreamBus, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty read only means nothing came within the wait: the catch-up goes on until the follower has handed out
    everything stored (with a 0.1 ms wait, reads come back empty before the server answers)."""
    monkeypatch.setattr(event_hub, "CATCH_UP_WAIT_SECONDS", 0.0001)
    bus = koordbus_bus
    await bus.ensure_streams(streams.all_streams())
    for n in range(30):
        await bus.publish(subjects.noderesource_computed(f"n{n}"), json.dumps({"n": n}).encode(), msg_id=f"{n}")
    hub = EventHub(bus, batch_size=4)
    try:
        sub = await hub.subscribe(catalogue.parse_filter(["noderesource.computed"], {}), caller="c")
        got: list[int] = []
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(5):  # an early end of the catch-up leaves the rest waiting for ever
                async for message in hub.events(sub, Start(time=0)):
                    if message.kind == "event":
                        got.append(json.loads(message.data)["data"]["n"])
                    if len(got) == 30:
                        break
        assert got == list(range(30))
    finally:
        await hub.close()


async def test_ending_the_streams_stops_every_reader_with_the_reason() -> None:
    """end_streams wakes a reader waiting for its next event and stops one whose queue is full of unread events;
    each one's last message says why; a subscription asked for afterwards is refused."""
    bus = MemoryBus()
    await bus.ensure_streams(streams.all_streams())
    hub = EventHub(bus, queue_size=3)
    try:
        wanted = catalogue.parse_filter(["noderesource.computed"], {})
        waiting = await hub.subscribe(wanted, caller="waiting")
        full = await hub.subscribe(wanted, caller="full")
        got: list[Message] = []

        async def read() -> None:
            async for message in hub.events(waiting, Start(), keepalive_seconds=3600):
                got.append(message)

        reading = asyncio.create_task(read())
        for n in range(3):
            await bus.publish(subjects.noderesource_computed(f"n{n}"), json.dumps({"n": n}).encode(), msg_id=f"{n}")
        await eventually(lambda: len(got) == 3 and full.queue.full())
        hub.end_streams("stopping for the test")
        await asyncio.wait_for(reading, 5)
        assert [m.kind for m in got] == ["event"] * 3 + ["shutdown"]
        assert json.loads(got[-1].data) == {"reason": "stopping for the test"}
        rest = [m async for m in hub.events(full, Start())]
        assert rest[-1].kind == "shutdown" and full.dropped is None
        assert hub.subscriptions == 0
        with pytest.raises(event_hub.CapacityError, match="stopping for the test"):
            await hub.subscribe(wanted, caller="late")
    finally:
        await hub.close()


async def test_a_catch_up_the_log_does_not_answer_drops_the_subscription_with_why(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The log times out under a catch-up read (a busy server: `consumer info` got no answer): the stream has begun,
    so it cannot become a 503; the subscriber is dropped with the reason and resumes from its last id. (It escaped
    as an exception after the response had started: an ERROR with a traceback, the stream cut without a word.)"""
    bus = MemoryBus()
    await bus.ensure_streams(streams.all_streams())
    for n in range(3):
        await bus.publish(subjects.noderesource_computed(f"n{n}"), json.dumps({"n": n}).encode(), msg_id=f"{n}")
    real_follow = bus.follow

    async def follow_that_times_out(*args: Any, **kwargs: Any) -> Any:
        follower = await real_follow(*args, **kwargs)

        async def caught_up() -> bool:
            raise BusUnavailableError("follow KOORD_NODERESOURCE: nats: timeout")

        async def nothing() -> list[Any]:
            return []

        monkeypatch.setattr(follower, "next", nothing)
        monkeypatch.setattr(follower, "caught_up", caught_up)
        return follower

    hub = EventHub(bus)
    try:
        sub = await hub.subscribe(catalogue.parse_filter(["noderesource.computed"], {}), caller="c")
        monkeypatch.setattr(bus, "follow", follow_that_times_out)
        got = [m async for m in hub.events(sub, Start(time=0))]
        assert [m.kind for m in got] == ["dropped"]
        assert "the event log did not answer" in json.loads(got[0].data)["reason"]
        assert hub.subscriptions == 0
    finally:
        await hub.close()


async def test_a_subscribe_racing_the_close_leaves_no_tail_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """The hub closes while a subscribe still asks the log where a stream ends: the subscribe is refused and starts
    no tail (one started then outlived the hub: a follower retrying on a closed connection for ever, as seen in the
    suite's log after the test that left it)."""
    bus = MemoryBus()
    await bus.ensure_streams(streams.all_streams())
    asked, answer = asyncio.Event(), asyncio.Event()
    real_bounds = bus.stream_bounds

    async def slow_bounds(stream: str) -> tuple[int, int]:
        asked.set()
        await answer.wait()
        return await real_bounds(stream)

    monkeypatch.setattr(bus, "stream_bounds", slow_bounds)
    hub = EventHub(bus)
    subscribing = asyncio.create_task(
        hub.subscribe(catalogue.parse_filter(["noderesource.computed"], {}), caller="late")
    )
    await asyncio.wait_for(asked.wait(), 5)
    closing = asyncio.create_task(hub.close())
    await asyncio.sleep(0)  # the close has begun and waits for the subscribe
    answer.set()
    with pytest.raises(event_hub.CapacityError, match="the server is stopping"):
        await asyncio.wait_for(subscribing, 5)
    await asyncio.wait_for(closing, 5)
    tails = [t for t in asyncio.all_tasks() if t.get_name().startswith("event-tail-")]
    assert tails == [] and hub.subscriptions == 0
