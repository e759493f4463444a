"""How many pull requests a JetStream consumer sends: a trickle of messages must not cost a request (or two) per
message, and a backlog must still arrive in full batches. The requests are counted by listening, as a second NATS
client, on the subject the consumer publishes them to."""

from __future__ import annotations

import asyncio
import json

import nats
from nats.js.api import ConsumerInfo

from bus.api import Delivery, FollowFrom
from bus.jetstream import JetStreamBus
from tests.bus import Names
from tests.support.waiting import eventually


class _Recorder:
    def __init__(self) -> None:
        self.handled: list[Delivery] = []

    async def handle(self, delivery: Delivery) -> None:
        self.handled.append(delivery)

    async def flush(self) -> None:
        return None


async def _count_pull_requests(nats_url: str, names: Names, durable: str) -> tuple[nats.NATS, list[dict[str, object]]]:
    requests: list[dict[str, object]] = []
    nc = await nats.connect(nats_url)

    async def record(msg: nats.aio.msg.Msg) -> None:
        requests.append(json.loads(msg.data))

    await nc.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{names.stream}.{durable}", cb=record)
    await nc.flush()
    return nc, requests


async def test_a_trickle_costs_a_pull_request_per_batch_or_expiry_not_per_message(
    jetstream_bus: JetStreamBus, nats_url: str
) -> None:
    names = Names()
    bus = jetstream_bus
    await bus.ensure_streams([names.stream_spec()])
    listener, requests = await _count_pull_requests(nats_url, names, "trickle")
    recorder = _Recorder()
    consumer = bus.consume(names.consumer("trickle", batch_size=64, fetch_timeout_seconds=1.0), recorder)
    try:
        await eventually(lambda: len(requests) >= 1)
        for k in range(40):  # 40 messages over ~2 s: one every 50 ms, each handled before the next is sent
            await bus.publish(names.subject("a"), f"m{k}".encode(), msg_id=f"m{k}")
            await eventually(lambda k=k: len(recorder.handled) == k + 1, timeout=5)
            await asyncio.sleep(0.05)
    finally:
        await consumer.stop()
        await listener.close()
    assert [d.data for d in recorder.handled] == [f"m{k}".encode() for k in range(40)]
    # Asking per message made 40-80 requests; open requests of 64 expiring every 0.9 s make about one per 0.9 s
    # (the run takes ~2.5 s) plus one ahead of time per 32 messages.
    assert len(requests) <= 8, requests
    assert all(r.get("batch") == 64 and not r.get("no_wait") for r in requests)


async def test_a_backlog_arrives_in_full_batches(jetstream_bus: JetStreamBus, nats_url: str) -> None:
    names = Names()
    bus = jetstream_bus
    await bus.ensure_streams([names.stream_spec()])
    for k in range(200):
        await bus.publish(names.subject("a"), f"m{k}".encode(), msg_id=f"m{k}")
    sizes: list[int] = []

    class _Batches(_Recorder):
        async def flush(self) -> None:
            sizes.append(len(self.handled) - sum(sizes))

    recorder = _Batches()
    consumer = bus.consume(names.consumer("backlog", batch_size=50, fetch_timeout_seconds=1.0), recorder)
    try:
        await eventually(lambda: len(recorder.handled) == 200, timeout=10)
    finally:
        await consumer.stop()
    assert [d.data for d in recorder.handled] == [f"m{k}".encode() for k in range(200)]
    assert len(sizes) <= 8, sizes  # 4 full batches, give or take a split where a request ran out


async def test_a_follower_whose_consumer_the_server_dropped_goes_on_from_where_it_was(
    jetstream_bus: JetStreamBus, nats_url: str
) -> None:
    names = Names()
    bus = jetstream_bus
    await bus.ensure_streams([names.stream_spec()])
    for k in range(3):
        await bus.publish(names.subject("a"), f"m{k}".encode(), msg_id=f"m{k}")
    follower = await bus.follow(names.stream, (names.subject(">"),), FollowFrom(sequence=1), wait_seconds=0.3)
    admin = await nats.connect(nats_url)
    try:
        assert [d.data for d in await follower.next()] == [b"m0", b"m1", b"m2"]
        js = admin.jetstream()
        dropped = [c.name for c in await js.consumers_info(names.stream)]
        assert len(dropped) == 1 and dropped[0].startswith("follow-")
        await js.delete_consumer(names.stream, dropped[0])
        for k in range(3, 5):
            await bus.publish(names.subject("a"), f"m{k}".encode(), msg_id=f"m{k}")
        got: list[bytes] = []
        for _ in range(20):
            got += [d.data for d in await follower.next()]
            if len(got) >= 2:
                break
        assert got == [b"m3", b"m4"]  # nothing lost, nothing repeated
    finally:
        await follower.close()
        await admin.close()
    assert [c.name for c in await admin_consumers(nats_url, names.stream)] == []  # close deletes its consumer


async def admin_consumers(nats_url: str, stream: str) -> list[ConsumerInfo]:
    nc = await nats.connect(nats_url)
    try:
        return list(await nc.jetstream().consumers_info(stream))
    finally:
        await nc.close()
