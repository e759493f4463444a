"""The byte caps `koordbus up` puts on its high-volume streams (bus.streams.SizeCaps), on a real nats-server: the
streams carry them (brought to them when they were created without, as in a data dir from an older version), a
stream published past its cap stays within it by dropping its oldest messages (every publish acknowledged), and what
reads history copes: a consumer asking for older messages (nodemetric's replay by time, a projection resuming from
an offset) starts at the oldest kept, the last message of a rarely written subject is still there while it is
among the newest bytes, and an event cursor older than the stream gets a warning naming what is gone."""

from __future__ import annotations

import json

import msgspec
from nats.js import api as js_api

from bus import streams, subjects
from bus.api import ConsumerSpec, DeliverPolicy, Delivery
from bus.jetstream import JetStreamBus
from services.api import event_catalogue as catalogue
from services.api.event_hub import EventHub, Start
from tests.support.waiting import eventually

KIB = 1024
CAPS = streams.SizeCaps(node=256 * KIB, nodemetric=128 * KIB, noderesource=64 * KIB)
PAYLOAD = b"x" * 1000


async def _info(bus: JetStreamBus, stream: str) -> js_api.StreamInfo:
    return await bus.jetstream.stream_info(stream)


async def test_the_caps_are_on_the_streams_and_nothing_else_changes(koordbus_bus: JetStreamBus) -> None:
    bus = koordbus_bus  # its streams were created without caps (tests/fixtures/nats.py)
    assert (await _info(bus, streams.KOORD_NODE)).config.max_bytes == -1
    await bus.ensure_streams(streams.all_streams(caps=CAPS))
    for stream, cap in (
        (streams.KOORD_NODE, CAPS.node),
        (streams.KOORD_NODEMETRIC, CAPS.nodemetric),
        (streams.KOORD_NODERESOURCE, CAPS.noderesource),
    ):
        config = (await _info(bus, stream)).config
        assert config.max_bytes == cap
        assert config.discard == js_api.DiscardPolicy.OLD  # the oldest go; a publish is never refused
    assert (await _info(bus, streams.KOORD_NODE)).config.max_age == 2 * 3600  # the max age still holds too
    for stream in (streams.KOORD_QUOTA, streams.KOORD_MIGRATION, streams.KOORD_CLUSTER, streams.KOORD_DLQ):
        assert (await _info(bus, stream)).config.max_bytes == -1  # logs and last values: never capped
    await bus.ensure_streams(streams.all_streams())  # a service joining the cluster keeps the operator's caps
    assert (await _info(bus, streams.KOORD_NODE)).config.max_bytes == CAPS.node
    await bus.ensure_streams(streams.all_streams(caps=streams.SizeCaps(node=-1, nodemetric=-1, noderesource=-1)))
    assert (await _info(bus, streams.KOORD_NODE)).config.max_bytes == -1  # and back: a cap set to -1 is lifted


async def test_a_stream_published_past_its_cap_stays_within_it(koordbus_bus: JetStreamBus) -> None:
    bus = koordbus_bus
    await bus.ensure_streams(streams.all_streams(caps=CAPS))
    for n in range(600):  # ~600 KB of agent reports into 256 KiB
        await bus.publish(subjects.node_metrics(f"n{n % 10}"), PAYLOAD, msg_id=f"metrics-{n}")
    state = (await _info(bus, streams.KOORD_NODE)).state
    assert state.bytes <= CAPS.node
    assert state.last_seq == 600 and state.first_seq > 1
    assert state.messages == state.last_seq - state.first_seq + 1  # the oldest went, in order
    newest = await bus.last_on_subject(streams.KOORD_NODE, subjects.stored(subjects.node_metrics("n9")))
    assert newest is not None and newest.stream_seq == 600


async def test_history_readers_start_at_the_oldest_kept(koordbus_bus: JetStreamBus) -> None:
    bus = koordbus_bus
    await bus.ensure_streams(streams.all_streams(caps=CAPS))
    await bus.publish(subjects.NODERESOURCE_CONFIG_STATUS, b'{"error": null}', msg_id="config-status")
    for n in range(150):  # ~150 KB of decisions into 64 KiB
        body = json.dumps({"node": f"n{n % 5}", "n": n, "pad": "x" * 900}).encode()
        await bus.publish(subjects.noderesource_computed(f"n{n % 5}"), body, msg_id=f"decision-{n}")
    first, last = await bus.stream_bounds(streams.KOORD_NODERESOURCE)
    assert first > 2 and last == 151
    # the config status was the oldest message: the cap took it (documented: a rare subject lives as long as the
    # stream's bytes reach back to it), while every node's last decision is there
    assert await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_CONFIG_STATUS) is None
    for node in range(5):
        kept = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed(f"n{node}"))
        assert kept is not None and json.loads(kept.data)["n"] >= 145

    # a durable consumer replaying by time (nodemetric's windows) or resuming from an offset the cap overtook (a
    # projection) starts at the oldest message kept
    for policy, start in (("by_start_time", {"opt_start_time": 1.0}), ("by_start_sequence", {"opt_start_seq": 1})):
        seen = await _consume_first(bus, policy, start)
        assert seen == first, policy

    # an event cursor older than the stream: the page starts at the oldest kept, after a warning naming what is gone
    hub = EventHub(bus)
    try:
        wanted = catalogue.parse_filter(["noderesource.computed"], {})
        envelopes, _, warnings = await hub.history(wanted, Start(cursor={streams.KOORD_NODERESOURCE: 1}), limit=5)
        assert warnings == [f"KOORD_NODERESOURCE no longer holds sequences 2..{first - 1}"]
        assert [msgspec.json.decode(e)["seq"] for e in envelopes] == list(range(first, first + 5))
    finally:
        await hub.close()


class _First:
    def __init__(self) -> None:
        self.seqs: list[int] = []

    async def handle(self, delivery: Delivery) -> None:
        self.seqs.append(delivery.stream_seq)

    async def flush(self) -> None:
        pass


async def _consume_first(bus: JetStreamBus, policy: DeliverPolicy, start: dict[str, float | int]) -> int:
    handler = _First()
    spec = ConsumerSpec(
        durable=f"caps-{policy.replace('_', '-')}",
        stream=streams.KOORD_NODERESOURCE,
        filter_subjects=(subjects.NODERESOURCE_ALL,),
        service="test",
        deliver_policy=policy,
        **start,  # type: ignore[arg-type]
    )
    consumer = bus.consume(spec, handler, reset=True)
    try:
        await eventually(lambda: bool(handler.seqs))
    finally:
        await consumer.stop()
    return handler.seqs[0]
