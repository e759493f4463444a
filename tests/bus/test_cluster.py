"""The bus on a three-server JetStream cluster (tests/fixtures/nats_cluster.py: the chart's configuration, R3
streams): the cluster forms with authenticated routes and nothing anonymous; publishes — single, pipelined and
optimistic-concurrency appends — ride out the loss of their stream's leader, every acknowledged one stored exactly
once; a member started again catches up and serves what it missed; an ack sent while a consumer has no leader is
sent again rather than waiting out ack_wait."""

from __future__ import annotations

import asyncio
import json

import pytest

from bus import api, streams, subjects
from bus.errors import ConflictError
from bus.jetstream import consumer_config
from tests.bus import Names
from tests.faults.processes import stream_messages, wait_for
from tests.fixtures.nats_cluster import REPLICAS, ClusterUnderTest

pytestmark = pytest.mark.timeout(60)

ELECTION_SECONDS = 30.0
"""Bound for a new leader after a kill (nats-server takes a few seconds)."""
ACK_WAIT_SECONDS = 30.0


async def test_the_cluster_forms_with_authenticated_routes_and_r3_streams(nats_cluster: ClusterUnderTest) -> None:
    cluster = nats_cluster.cluster
    assert await cluster.meta_leader() in {cluster.server_name(i) for i in range(3)}
    for spec in streams.all_streams():
        assert await cluster.stream_current(spec.name), spec.name
    for member in cluster.members:
        config = (member.data_dir / "nats-server.conf").read_text()
        assert 'authorization { user: "route"' in config and "auth_callout" in config and "jetstream: enabled" in config
        assert "nats://route:" in config  # every route presents the route user's credentials
        assert 'http: "127.0.0.1:' in config  # monitoring on loopback only
    bus = await nats_cluster.connect("forms")
    try:
        ack = await bus.publish(subjects.node_metrics("n1"), b"x", msg_id="forms-1")
        assert ack.stream == streams.KOORD_NODE
        info = await bus.jetstream.stream_info(streams.KOORD_NODE)
        assert info.config.num_replicas == REPLICAS and info.cluster is not None
    finally:
        await bus.close()
    for url in cluster.urls:  # nothing anonymous: every member asks a client for credentials
        assert (await _greeting(url))["auth_required"] is True


async def _greeting(url: str) -> dict[str, object]:
    """The INFO a member greets a client with."""
    host, _, port = url.removeprefix("nats://").rpartition(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        line = await asyncio.wait_for(reader.readline(), timeout=5)
    finally:
        writer.close()
    info: dict[str, object] = json.loads(line.removeprefix(b"INFO "))
    return info


async def test_publishes_ride_out_the_loss_of_their_stream_leader(nats_cluster: ClusterUnderTest) -> None:
    cluster = nats_cluster.cluster
    leader = await cluster.stream_leader(streams.KOORD_NODE)
    assert leader is not None
    # One publisher loses its server with the leader (it reconnects to another), one keeps its connection and meets
    # the election (no responders, or no answer: a follower ignores it, until a follower is elected). Whether a
    # publish is in flight at the election is up to timing; that none fails, and none is lost or doubled, is not.
    on_leader = await nats_cluster.connect("on-leader", members=[cluster.index_of(leader)], max_in_flight=256)
    follower = next(i for i in range(3) if cluster.server_name(i) != leader)
    bus = await nats_cluster.connect("on-follower", members=[follower], max_in_flight=256)
    acked: list[str] = []
    stop = asyncio.Event()

    async def publish_singles() -> None:
        n = 0
        while not stop.is_set():
            mid = f"single-{n}"
            await on_leader.publish(subjects.node_metrics(f"n{n % 7}"), b"s", msg_id=mid)
            acked.append(mid)
            n += 1

    async def publish_batches() -> None:
        n = 0
        while not stop.is_set():
            batch = [(subjects.node_metrics(f"n{i}"), b"b", f"batch-{n}-{i}") for i in range(20)]
            await bus.publish_many(batch)
            acked.extend(mid for _, _, mid in batch)
            n += 1

    publishers = [asyncio.create_task(publish_singles()), asyncio.create_task(publish_batches())]
    try:
        await wait_for(lambda: _more_than(acked, 200), timeout=10, what="publishing before the kill")
        await cluster.kill(cluster.index_of(leader))
        before = len(acked)
        new_leader = await cluster.wait_for(
            lambda: cluster.stream_leader(streams.KOORD_NODE), timeout=ELECTION_SECONDS, what="a new leader"
        )
        assert new_leader != leader
        await wait_for(lambda: _more_than(acked, before + 200), timeout=ELECTION_SECONDS, what="publishes after it")
    finally:
        stop.set()
        await asyncio.gather(*publishers)  # a publisher's error fails the test here
    stored = await stream_messages(bus, streams.KOORD_NODE, subjects.NODE_METRICS_ALL)
    ids = [m.msg_id for m in stored if m.msg_id != "forms-1"]
    assert sorted(ids) == sorted(acked)  # every acknowledged publish stored, exactly once

    await cluster.restart(cluster.index_of(leader))
    await wait_for(lambda: cluster.stream_current(streams.KOORD_NODE), timeout=ELECTION_SECONDS, what="catch-up")
    await on_leader.close()
    await bus.close()


async def test_two_publishers_racing_with_one_msg_id_are_both_acked_and_it_is_stored_once(
    nats_cluster: ClusterUnderTest,
) -> None:
    # Two replicas that both own a partition for a moment publish the same decision under the same msg id. A
    # replicated stream answers the second, while it still stores the first, "duplicate message id is in process"
    # (10158): the bus retries it (bus.retry) and it is acked as a duplicate (before, BusError for most of these).
    first, second = await nats_cluster.connect("racer-1"), await nats_cluster.connect("racer-2")
    try:
        for n in range(30):
            batch = [(subjects.node_metrics(f"n{n}"), b"r", f"race-{n}")] * 3
            acks = await asyncio.gather(first.publish_many(batch), second.publish_many(batch))
            assert {(a.stream, a.seq) for racer in acks for a in racer} == {(acks[0][0].stream, acks[0][0].seq)}
        stored = await stream_messages(first, streams.KOORD_NODE, subjects.NODE_METRICS_ALL)
        assert sorted(m.msg_id for m in stored) == sorted(f"race-{n}" for n in range(30))
    finally:
        await first.close()
        await second.close()


async def test_two_writers_racing_conditional_publishes_store_one_per_subject(
    nats_cluster: ClusterUnderTest,
) -> None:
    # Two noderesource replicas that both own a partition for a moment decide its nodes from different views (other
    # msg ids), each batch conditional on the subject's last sequence it knows: the replicated stream stores one of
    # each pair and refuses the other, whichever server each replica is connected to.
    cluster = nats_cluster.cluster
    first = await nats_cluster.connect("decider-1", members=[0])
    second = await nats_cluster.connect("decider-2", members=[1, 2])
    try:
        nodes = [f"race-node-{n}" for n in range(40)]

        def batch(who: str) -> list[tuple[str, bytes, str, int]]:
            return [(subjects.noderesource_computed(n), who.encode(), f"{who}-{n}", 0) for n in nodes]

        acks = await asyncio.gather(first.publish_many_if_last(batch("a")), second.publish_many_if_last(batch("b")))
        for n, pair in enumerate(zip(*acks, strict=True)):
            assert sum(ack is not None for ack in pair) == 1, (nodes[n], pair)
        stored = await stream_messages(first, streams.KOORD_NODERESOURCE, subjects.NODERESOURCE_COMPUTED_ALL)
        winners = {m.subject: m.data for m in stored}
        assert len(stored) == len(nodes) == len(winners)
        for n, node in enumerate(nodes):
            won = b"a" if acks[0][n] is not None else b"b"
            assert winners[subjects.noderesource_computed(node)] == won

        # The same race one append at a time (the quota service's): one stored, the other a ConflictError (before,
        # BusError for the cluster's own code for it, 10164, whenever the winner was still being proposed)
        empty = api.PublishOptions(expected_last_subject_seq=0)
        for n in range(40):
            subject = subjects.quota_events(f"race-tree-{n}")
            results = await asyncio.gather(
                first.publish(subject, b"a", msg_id=f"qa-{n}", options=empty),
                second.publish(subject, b"b", msg_id=f"qb-{n}", options=empty),
                return_exceptions=True,
            )
            assert sorted(type(r).__name__ for r in results) == ["ConflictError", "PublishAck"], results
        assert await cluster.meta_leader() is not None
    finally:
        await first.close()
        await second.close()


async def test_an_expected_sequence_append_across_a_leader_change_lands_once_and_a_rival_loses(
    nats_cluster: ClusterUnderTest,
) -> None:
    cluster = nats_cluster.cluster
    leader = await cluster.stream_leader(streams.KOORD_QUOTA)
    assert leader is not None
    bus = await nats_cluster.connect("appender", members=[i for i in range(3) if cluster.server_name(i) != leader])
    subject = subjects.quota_events("team-a")
    empty = api.PublishOptions(expected_last_subject_seq=0)
    first = await bus.publish(subject, b"created", msg_id="q-1", options=empty)
    await cluster.kill(cluster.index_of(leader))

    after = api.PublishOptions(expected_last_subject_seq=first.seq)
    second = await bus.publish(subject, b"updated", msg_id="q-2", options=after)  # during the election: retried
    assert sum(bus.publish_retries.values()) > 0 and not second.duplicate, bus.publish_retries
    again = await bus.publish(subject, b"updated", msg_id="q-2", options=after)  # its ack lost: sent once more
    assert again.duplicate and again.seq == second.seq
    with pytest.raises(ConflictError):  # a rival who read the same tree loses
        await bus.publish(subject, b"rival", msg_id="q-3", options=after)

    await cluster.restart(cluster.index_of(leader))
    await wait_for(lambda: cluster.stream_current(streams.KOORD_QUOTA), timeout=ELECTION_SECONDS, what="catch-up")
    # The member started again has the log: with the other leader gone it serves it.
    current = await cluster.stream_leader(streams.KOORD_QUOTA)
    assert current is not None
    await cluster.kill(cluster.index_of(current))
    await cluster.wait_for(lambda: cluster.stream_leader(streams.KOORD_QUOTA), timeout=ELECTION_SECONDS)
    await cluster.wait_for(cluster.meta_leader, timeout=ELECTION_SECONDS)  # reading makes a consumer: the meta layer
    stored = await stream_messages(bus, streams.KOORD_QUOTA, subject)
    assert [(m.msg_id, m.data) for m in stored] == [("q-1", b"created"), ("q-2", b"updated")]
    await bus.close()


async def _more_than(items: list[str], count: int) -> bool:
    return len(items) > count


class _Held:
    """A handler that holds the first message until released (so its ack goes out when the test says)."""

    def __init__(self) -> None:
        self.holding = asyncio.Event()
        self.release = asyncio.Event()
        self.handled: list[api.Delivery] = []

    async def handle(self, delivery: api.Delivery) -> None:
        if not self.handled:
            self.holding.set()
            await self.release.wait()
        self.handled.append(delivery)

    async def flush(self) -> None:
        return None


async def test_an_ack_sent_while_its_consumer_has_no_leader_is_sent_again_not_lost_until_ack_wait(
    nats_cluster: ClusterUnderTest,
) -> None:
    """The consumer's leader is killed while the handler holds a message; the handler then finishes and its ack
    leaves while no server leads the consumer. The bus sends it again once unconfirmed, so the consumer is idle well
    before ack_wait, when the new leader would otherwise redeliver it."""
    cluster = nats_cluster.cluster
    names = Names()
    setup = await nats_cluster.connect("setup")
    await setup.ensure_streams([names.stream_spec(replicas=REPLICAS, storage="file")])
    for i in range(3):
        await setup.publish(names.subject("x"), f"m{i}".encode(), msg_id=f"m{i}")
    spec = names.consumer(ack_wait_seconds=ACK_WAIT_SECONDS, fetch_timeout_seconds=0.5)
    await setup.jetstream.add_consumer(spec.stream, config=consumer_config(spec))  # its leader known before it runs
    leader = await cluster.wait_for(lambda: cluster.consumer_leader(spec.stream, spec.durable))
    await setup.close()
    # The consumer's bus keeps its connection: it is on a member that does not lead the consumer.
    bus = await nats_cluster.connect("consumer", members=[i for i in range(3) if cluster.server_name(i) != leader])
    handler = _Held()
    consumer = bus.consume(spec, handler)
    try:
        await asyncio.wait_for(handler.holding.wait(), timeout=10)
        killed_at = asyncio.get_running_loop().time()
        await cluster.kill(cluster.index_of(leader))
        handler.release.set()  # the acks go out now, to no leader
        assert await consumer.wait_idle(timeout=ACK_WAIT_SECONDS - 5), f"waited for ack_wait: {consumer.stats}"
        idle_after = asyncio.get_running_loop().time() - killed_at
        assert consumer.stats.acks_resent > 0 and idle_after < ACK_WAIT_SECONDS - 5
        assert sorted(d.data for d in handler.handled) == [b"m0", b"m1", b"m2"]  # nothing redelivered
    finally:
        await consumer.stop()
        await bus.close()


async def test_a_read_made_while_the_cluster_has_no_meta_leader_waits_for_the_next(
    nats_cluster: ClusterUnderTest,
) -> None:
    """A read makes an ephemeral consumer, which only the meta leader creates: right after it is lost the servers
    answer "JetStream system temporarily unavailable" (a combined failover run's own read failed so, after
    everything had caught up). The read is made again until a new meta leader takes it."""
    cluster = nats_cluster.cluster
    leader = await cluster.meta_leader()
    assert leader is not None
    bus = await nats_cluster.connect("reader", members=[i for i in range(3) if cluster.server_name(i) != leader])
    subject = subjects.quota_events("team-read")
    await bus.publish(subject, b"created", msg_id="r-1")

    await cluster.kill(cluster.index_of(leader))
    stored = await stream_messages(bus, streams.KOORD_QUOTA, subject)

    assert [(m.msg_id, m.data) for m in stored] == [("r-1", b"created")]
    assert sum(bus.publish_retries.values()) > 0, "the read was not refused once: nothing tested"
    await cluster.restart(cluster.index_of(leader))
    await bus.close()
