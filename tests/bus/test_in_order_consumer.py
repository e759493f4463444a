"""A consumer read in stream order (ConsumerSpec.retry_flush_in_place: the projectors, whose stores skip what is at
or below their offset) never hands out a message after newer ones, even when deliveries are lost in flight, on a
real nats-server.

Deliveries get lost in flight when the server that sent a pull's messages, or the connection, goes down with them
(a NATS cluster losing the consumer's leader): the server redelivers them only after ack_wait, after newer messages
the projector has already written past; its store then skipped them for good (tests/faults/test_cluster_combined.py
found a noderesource projection missing a node's latest decision). Here a pull request answered on another
connection, which drops what it gets, stands for the lost deliveries, between two fetches of the consumer's own
source; the server's 503 answer to a pull while the consumer has no leader, sent to the source's inbox from another
connection, stands for the election that follows (the source binds the consumer again)."""

from __future__ import annotations

import nats
import pytest
from nats.js.api import ConsumerInfo

from bus.api import ConsumerStats
from bus.jetstream import JetStreamBus, _PullSource
from tests.bus import Names
from tests.support.waiting import eventually


async def _handed_out(source: _PullSource) -> list[int]:
    fetched = await source.fetch()
    for one in fetched:
        await one.acker.ack()
    return [one.delivery.stream_seq for one in fetched]


async def _lose_deliveries(nats_url: str, names: Names, durable: str, count: int) -> list[int]:
    """A pull for `count` messages answered on another connection, which drops them unacknowledged (the server
    delivers only to a reply subject someone listens on): delivered, never seen by the consumer's source."""
    nc = await nats.connect(nats_url)
    lost: list[int] = []
    try:

        async def drop(msg: nats.aio.msg.Msg) -> None:
            lost.append(msg.metadata.sequence.stream)

        inbox = nc.new_inbox()
        await nc.subscribe(inbox, cb=drop)
        request = f'{{"batch": {count}, "no_wait": true}}'.encode()
        await nc.publish(f"$JS.API.CONSUMER.MSG.NEXT.{names.stream}.{durable}", request, reply=inbox)
        await eventually(lambda: len(lost) == count)
    finally:
        await nc.close()
    return lost


async def _answer_no_leader(nats_url: str, source: _PullSource) -> None:
    """What the source's pull gets while its consumer has no leader: a 503 status on its inbox."""
    assert source._inbox is not None
    nc = await nats.connect(nats_url)
    try:
        await nc.publish(source._inbox, b"", headers={"Status": "503"})
        await nc.flush()
    finally:
        await nc.close()
    await eventually(lambda: source._lost)


@pytest.mark.parametrize("then", ["fetch", "leader lost"])
async def test_deliveries_lost_in_flight_are_handed_out_again_before_anything_newer(
    jetstream_bus: JetStreamBus, nats_url: str, then: str
) -> None:
    """`leader lost`: the source binds the consumer again before its next fetch (tests/faults/test_cluster_combined.py
    found a migration projection missing a job: the message the killed leader had sent was lost, the rebind forgot
    the last delivery received, and the next message was handed out unchecked)."""
    names = Names()
    bus = jetstream_bus
    await bus.ensure_streams([names.stream_spec()])
    for k in range(1, 11):
        await bus.publish(names.subject("a"), f"m{k}".encode(), msg_id=f"m{k}")
    spec = names.consumer(
        "ordered",
        batch_size=4,
        fetch_timeout_seconds=0.5,
        retry_flush_in_place=True,
        deliver_policy="by_start_sequence",
        opt_start_seq=1,
    )
    source = _PullSource(bus._nc, bus._js, spec, reset=True)
    source.stats = ConsumerStats()
    try:
        handed: list[int] = []
        while len(handed) < 4:
            handed += await _handed_out(source)
        assert handed == [1, 2, 3, 4]

        async def delivered_through(stream_seq: int) -> bool:
            info: ConsumerInfo = await bus._js.consumer_info(names.stream, "ordered")
            return info.delivered.stream_seq == stream_seq

        await eventually(lambda: delivered_through(4))  # the source's own pull is over: nothing else is open
        assert await _lose_deliveries(nats_url, names, "ordered", 3) == [5, 6, 7]
        if then == "leader lost":
            await _answer_no_leader(nats_url, source)

        for _ in range(20):
            handed += await _handed_out(source)
            if len(handed) >= 10:
                break
        assert handed == list(range(1, 11))  # 5, 6, 7 again, before 8, 9, 10; nothing twice
        assert source.stats.deliveries_lost == 3
    finally:
        await source.close()
