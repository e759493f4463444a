"""The bus contract: MemoryBus and JetStreamBus (on a real nats-server) must pass every test here."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

import msgspec
import pytest
import pytest_asyncio

from bus import api, rpc, streams, subject_transform, subjects
from bus.errors import BusError, BusUnavailableError, ConflictError, PermanentError, RemoteError, TemporaryError
from bus.jetstream import JetStreamBus
from bus.memory import MemoryBus
from tests.bus import Names, Recorder, wait_until

AnyBus = MemoryBus | JetStreamBus
BusFactory = Callable[..., Awaitable[AnyBus]]


@pytest.fixture(params=["memory", "jetstream"])
def backend_url(request: pytest.FixtureRequest) -> str | None:
    """None for the MemoryBus, else the session nats-server's URL (started only when needed)."""
    if request.param == "memory":
        return None
    url: str = request.getfixturevalue("nats_url")
    return url


@pytest_asyncio.fixture
async def make_bus(backend_url: str | None) -> AsyncIterator[BusFactory]:
    opened: list[AnyBus] = []

    async def make(max_in_flight: int = 1024) -> AnyBus:
        bus: AnyBus
        if backend_url is None:
            bus = MemoryBus(max_in_flight=max_in_flight)
        else:
            bus = await JetStreamBus.connect(backend_url, name="contract", max_in_flight=max_in_flight)
        opened.append(bus)
        return bus

    yield make
    for bus in opened:
        await bus.close()


@pytest_asyncio.fixture
async def bus(make_bus: BusFactory) -> AnyBus:
    return await make_bus()


@pytest.fixture
def names() -> Names:
    return Names()


async def ready(bus: AnyBus, names: Names, **stream: object) -> None:
    await bus.ensure_streams([names.stream_spec(**stream), names.dlq_spec()])


async def publish_n(bus: AnyBus, names: Names, n: int, *, token: str = "a") -> list[api.PublishAck]:
    return [await bus.publish(names.subject(token), f"m{i}".encode(), msg_id=f"{token}-{i}") for i in range(n)]


async def dead_letters(bus: AnyBus, names: Names, count: int) -> list[api.Delivery]:
    reader = Recorder()
    consumer = bus.consume(names.dlq_consumer(), reader)
    try:
        await wait_until(lambda: len(reader.committed) >= count)
    finally:
        await consumer.stop()
    return reader.committed


async def test_ensure_streams_is_idempotent_and_applies_changes(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await publish_n(bus, names, 3)
    await ready(bus, names)
    assert await bus.stream_info(names.stream) == (3, 3)

    other = f"o{names.uid}.x"
    with pytest.raises(BusUnavailableError):
        await bus.publish(other, b"x", msg_id="o-1")
    await ready(bus, names, subjects=(names.subject(">"), other), max_msgs_per_subject=1)
    ack = await bus.publish(other, b"x", msg_id="o-1")
    assert (ack.stream, ack.seq) == (names.stream, 4)
    await bus.publish(names.subject("a"), b"newest", msg_id="a-new")
    count, last = await bus.stream_info(names.stream)
    assert last == 5
    assert count == 2  # one per subject: "a" kept only its newest, "other" its one
    newest = await bus.last_on_subject(names.stream, names.subject("a"))
    assert newest is not None and newest.data == b"newest"


async def test_consume_delivers_in_order_with_metadata(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    acks = [
        await bus.publish(
            names.subject("n1", "metrics"),
            f"{i}".encode(),
            msg_id=f"id-{i}",
            options=api.PublishOptions(headers={"Koord-Test": f"h{i}"}),
        )
        for i in range(5)
    ]
    assert [a.seq for a in acks] == [1, 2, 3, 4, 5]
    assert all(a.stream == names.stream and not a.duplicate for a in acks)
    rec = Recorder()
    consumer = bus.consume(names.consumer(), rec)
    await wait_until(lambda: len(rec.committed) == 5)
    assert await consumer.wait_idle(5)
    await consumer.stop()
    assert [d.data for d in rec.committed] == [b"0", b"1", b"2", b"3", b"4"]
    assert [d.stream_seq for d in rec.committed] == [1, 2, 3, 4, 5]
    first = rec.committed[0]
    assert first.subject == names.subject("n1", "metrics")
    assert first.msg_id == "id-0"
    assert first.headers["Koord-Test"] == "h0"
    assert first.num_delivered == 1
    assert abs(first.published_at - asyncio.get_running_loop().time()) >= 0  # a float
    assert first.published_at > 1_600_000_000
    assert consumer.stats.delivered == 5 and consumer.stats.acked == 5


async def test_a_consumer_told_to_take_no_more_is_not_waited_for(bus: AnyBus, names: Names) -> None:
    # A process told to stop has every consumer stop_soon at once; a service's stop that then waited for its
    # projector to be idle waited out the whole timeout (`koordbus up` past its 8 s shutdown deadline).
    await ready(bus, names)
    rec = Recorder()
    consumer = bus.consume(names.consumer(), rec)
    assert await consumer.wait_idle(5)
    consumer.stop_soon()
    await bus.publish(names.subject("n1", "metrics"), b"late", msg_id="late")
    began = asyncio.get_running_loop().time()
    assert not await consumer.wait_idle(5)
    assert asyncio.get_running_loop().time() - began < 1.0
    await consumer.stop()
    assert rec.committed == []


async def test_each_delivery_says_how_many_matching_messages_are_still_to_come(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    for i in range(3):
        await bus.publish(names.subject("a"), f"a{i}".encode(), msg_id=f"a-{i}")
        await bus.publish(names.subject("b"), f"b{i}".encode(), msg_id=f"b-{i}")  # not the consumer's
    rec = Recorder()
    consumer = bus.consume(names.consumer(filter_subjects=(names.subject("a"),), batch_size=2), rec)
    await wait_until(lambda: len(rec.committed) == 3)
    await consumer.stop()
    assert [(d.data, d.pending) for d in rec.committed] == [(b"a0", 2), (b"a1", 1), (b"a2", 0)]
    assert consumer.stats.pending == 0
    assert consumer.stats.event_age_seconds.count == 3 and consumer.stats.handle_seconds.count == 3


async def test_duplicate_msg_id_is_stored_once(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    first = await bus.publish(names.subject("a"), b"one", msg_id="same")
    again = await bus.publish(names.subject("a"), b"one", msg_id="same")
    assert not first.duplicate
    assert again.duplicate and again.seq == first.seq
    rec = Recorder()
    consumer = bus.consume(names.consumer(), rec)
    assert await consumer.wait_idle(5)
    await consumer.stop()
    assert rec.committed_data() == [b"one"]


async def test_expected_last_subject_seq_conflict(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    tree = names.subject("quota", "tree1")
    opts = api.PublishOptions(expected_last_subject_seq=0)
    first = await bus.publish(tree, b"v1", msg_id="v1", options=opts)
    await bus.publish(names.subject("quota", "tree2"), b"other", msg_id="t2")
    with pytest.raises(ConflictError) as info:
        await bus.publish(tree, b"v2-loser", msg_id="v2-loser", options=opts)
    assert info.value.subject == tree and info.value.expected == 0
    won = await bus.publish(tree, b"v2", msg_id="v2", options=api.PublishOptions(expected_last_subject_seq=first.seq))
    assert won.seq == 3
    last = await bus.last_on_subject(names.stream, tree)
    assert last is not None and last.data == b"v2" and last.stream_seq == 3


async def test_temporary_error_redelivers(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await publish_n(bus, names, 2)

    def fail_first_try(d: api.Delivery) -> None:
        if d.data == b"m0" and d.num_delivered == 1:
            raise TemporaryError("store busy", delay=0.1)

    rec = Recorder(fail_first_try)
    consumer = bus.consume(names.consumer(), rec)
    await wait_until(lambda: len(rec.committed) == 2)
    assert await consumer.wait_idle(5)
    await consumer.stop()
    redelivered = [d for d in rec.committed if d.data == b"m0"]
    assert len(redelivered) == 1 and redelivered[0].num_delivered == 2
    assert consumer.stats.naked == 1 and consumer.stats.dead_lettered == 0


class Sample(msgspec.Struct):
    value: int


async def test_poison_messages_are_dead_lettered_and_the_loop_goes_on(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await bus.publish(names.subject("a"), b"permanent", msg_id="p")
    await bus.publish(names.subject("a"), b"not json", msg_id="j")
    await bus.publish(names.subject("a"), b'{"value": 7}', msg_id="ok")

    def behave(d: api.Delivery) -> None:
        if d.data == b"permanent":
            raise PermanentError("node has no capacity\nsecond line")
        msgspec.json.decode(d.data, type=Sample)

    rec = Recorder(behave)
    consumer = bus.consume(names.consumer(), rec)
    await wait_until(lambda: len(rec.committed) == 1)
    assert await consumer.wait_idle(5)
    await consumer.stop()
    assert rec.committed_data() == [b'{"value": 7}']
    assert consumer.stats.dead_lettered == 2 and consumer.stats.termed == 2

    letters = await dead_letters(bus, names, 2)
    assert [d.data for d in letters] == [b"permanent", b"not json"]
    assert all(d.subject == subjects.dlq(names.service) for d in letters)
    perm, bad = letters
    assert perm.headers[api.HEADER_DLQ_REASON] == "PermanentError: node has no capacity second line"
    assert "DecodeError" in bad.headers[api.HEADER_DLQ_REASON]
    assert perm.headers[api.HEADER_DLQ_SUBJECT] == names.subject("a")
    assert perm.headers[api.HEADER_DLQ_STREAM_SEQ] == "1"
    assert bad.headers[api.HEADER_DLQ_STREAM_SEQ] == "2"
    assert perm.headers[api.HEADER_DLQ_CONSUMER] == "c"
    assert perm.msg_id == f"dlq:{names.stream}:1"


async def test_max_deliver_exhaustion_dead_letters(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await bus.publish(names.subject("a"), b"flaky", msg_id="f")

    def always_busy(d: api.Delivery) -> None:
        raise TemporaryError("still busy", delay=0.05)

    rec = Recorder(always_busy)
    consumer = bus.consume(names.consumer(max_deliver=3), rec)
    await wait_until(lambda: consumer.stats.dead_lettered == 1)
    assert await consumer.wait_idle(5)
    await consumer.stop()
    assert [d.num_delivered for d in rec.seen] == [1, 2, 3]
    (letter,) = await dead_letters(bus, names, 1)
    assert letter.data == b"flaky"
    assert letter.headers[api.HEADER_DLQ_REASON] == "gave up after 3 deliveries: TemporaryError: still busy"


async def test_unexpected_exception_is_retried_not_fatal(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await publish_n(bus, names, 2)

    def crash_once(d: api.Delivery) -> None:
        if d.data == b"m0" and d.num_delivered == 1:
            raise ZeroDivisionError("bug")

    rec = Recorder(crash_once)
    consumer = bus.consume(names.consumer(), rec)
    await wait_until(lambda: len(rec.committed) == 2)
    await consumer.stop()
    assert sorted(rec.committed_data()) == [b"m0", b"m1"]
    assert "ZeroDivisionError" in consumer.stats.last_error


async def test_flush_failure_redelivers_the_batch(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await publish_n(bus, names, 3)
    rec = Recorder(flush_failures=1)
    consumer = bus.consume(names.consumer(), rec)
    await wait_until(lambda: len(rec.committed) == 3)
    assert await consumer.wait_idle(5)
    await consumer.stop()
    assert rec.committed_data() == [b"m0", b"m1", b"m2"]
    assert all(d.num_delivered == 2 for d in rec.committed)
    assert len(rec.seen) == 6
    assert consumer.stats.flush_failures == 1 and consumer.stats.naked == 3


async def test_durable_resumes_without_loss_or_reprocessing(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await publish_n(bus, names, 12)
    spec = names.consumer(batch_size=2)
    first = Recorder(pause=0.05)
    consumer = bus.consume(spec, first)
    await wait_until(lambda: len(first.committed) >= 4)
    await consumer.stop()
    stopped_at = len(first.committed)
    assert stopped_at < 12

    second = Recorder()
    resumed = bus.consume(spec, second)
    # Up to ack_wait for anything a stopped fetch had pulled but never handed over.
    await wait_until(lambda: stopped_at + len(second.committed) >= 12, timeout=15)
    assert await resumed.wait_idle(5)
    await resumed.stop()
    seqs = [d.stream_seq for d in first.committed + second.committed]
    assert sorted(seqs) == list(range(1, 13))
    assert not {d.stream_seq for d in first.committed} & {d.stream_seq for d in second.committed}


async def test_a_stop_mid_batch_hands_back_at_once_what_was_not_handled(bus: AnyBus, names: Names) -> None:
    """A stopping process does not work through the rest of a large batch (koordbus up's nodemetric ingest took its
    whole 8 s shutdown deadline doing so): the item being handled finishes, is flushed and acked, and the rest is
    nak'ed for redelivery now, not after ack_wait (30 s here)."""
    await ready(bus, names)
    await publish_n(bus, names, 20)
    spec = names.consumer(batch_size=20, ack_wait_seconds=30.0)
    first = Recorder(pause=0.05)
    consumer = bus.consume(spec, first)
    await wait_until(lambda: len(first.seen) >= 2)
    await consumer.stop()
    handled = len(first.seen)
    assert handled < 20 and first.committed == first.seen
    assert consumer.stats.naked <= 20 - handled  # a fetch may hand over fewer than the batch size

    second = Recorder()
    resumed = bus.consume(spec, second)
    await wait_until(lambda: handled + len(second.committed) >= 20, timeout=5)
    assert await resumed.wait_idle(5)
    await resumed.stop()
    seqs = [d.stream_seq for d in first.committed + second.committed]
    assert sorted(seqs) == list(range(1, 21))


async def test_reset_with_start_time_replays_from_that_time(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await publish_n(bus, names, 3)
    await asyncio.sleep(0.05)
    await publish_n(bus, names, 3, token="b")
    rec = Recorder()
    consumer = bus.consume(names.consumer(), rec)
    await wait_until(lambda: len(rec.committed) == 6)
    await consumer.stop()
    start = rec.committed[3].published_at

    replay = Recorder()
    spec = names.consumer(deliver_policy="by_start_time", opt_start_time=start)
    again = bus.consume(spec, replay, reset=True)
    await wait_until(lambda: len(replay.committed) >= 3)
    assert await again.wait_idle(5)
    await again.stop()
    assert [d.stream_seq for d in replay.committed] == [4, 5, 6]


async def test_reset_with_start_sequence_resumes_from_that_sequence(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await publish_n(bus, names, 5)
    rec = Recorder()
    spec = names.consumer(deliver_policy="by_start_sequence", opt_start_seq=3)
    consumer = bus.consume(spec, rec, reset=True)
    await wait_until(lambda: len(rec.committed) >= 3)
    assert await consumer.wait_idle(5)
    await consumer.stop()
    assert [d.stream_seq for d in rec.committed] == [3, 4, 5]


async def test_filter_subjects_deliver_only_matching(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    for i, token in enumerate(["metrics", "state", "other", "metrics", "state"]):
        await bus.publish(names.subject("n1", token), token.encode(), msg_id=f"f{i}")
    rec = Recorder()
    spec = names.consumer(filter_subjects=(names.subject("*", "metrics"), names.subject("*", "state")))
    consumer = bus.consume(spec, rec)
    await wait_until(lambda: len(rec.committed) == 4)
    assert await consumer.wait_idle(5)
    await consumer.stop()
    assert rec.committed_data() == [b"metrics", b"state", b"metrics", b"state"]

    single = Recorder()
    only = bus.consume(names.consumer("single", filter_subjects=(names.subject("n1", "other"),)), single)
    await wait_until(lambda: len(single.committed) == 1)
    assert await only.wait_idle(5)
    await only.stop()
    assert single.committed_data() == [b"other"]


async def test_last_on_subject(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    assert await bus.last_on_subject(names.stream, names.subject("x")) is None
    await bus.publish(names.subject("x"), b"1", msg_id="x1", options=api.PublishOptions(headers={"K": "v"}))
    await bus.publish(names.subject("y"), b"2", msg_id="y1")
    await bus.publish(names.subject("x"), b"3", msg_id="x2")
    last = await bus.last_on_subject(names.stream, names.subject("x"))
    assert last is not None
    assert (last.subject, last.data, last.stream_seq, last.msg_id) == (names.subject("x"), b"3", 3, "x2")
    assert last.published_at > 1_600_000_000


async def test_last_on_subject_by_direct_get(bus: AnyBus, names: Names) -> None:
    await ready(bus, names, allow_direct=True, max_msgs_per_subject=1)
    assert await bus.last_on_subject(names.stream, names.subject("k"), direct=True) is None
    await bus.publish(names.subject("k"), b"1", msg_id="k1")
    await bus.publish(names.subject("k"), b"2", msg_id="k2", options=api.PublishOptions(headers={"K": "v"}))
    last = await bus.last_on_subject(names.stream, names.subject("k"), direct=True)
    assert last is not None and (last.data, last.stream_seq, last.headers.get("K")) == (b"2", 2, "v")


async def test_read_recent_returns_the_newest_matching_messages_oldest_first(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    assert await bus.read_recent(names.stream, names.subject("n1", "*"), since=0, limit=10) == []
    for i in range(5):
        await bus.publish(names.subject("n1", "act"), f"a{i}".encode(), msg_id=f"a{i}")
        await bus.publish(names.subject("n2", "act"), f"b{i}".encode(), msg_id=f"b{i}")
    recent = await bus.read_recent(names.stream, names.subject("n1", "*"), since=0, limit=3)
    assert [d.data for d in recent] == [b"a2", b"a3", b"a4"]
    assert all(d.subject == names.subject("n1", "act") for d in recent)
    assert [d.stream_seq for d in recent] == [5, 7, 9]
    assert await bus.read_recent(names.stream, names.subject("n1", "act"), since=0, limit=0) == []
    later = await bus.read_recent(names.stream, names.subject("n1", "act"), since=recent[-1].published_at, limit=10)
    assert [d.data for d in later] == [b"a4"]
    future = await bus.read_recent(names.stream, names.subject(">"), since=recent[-1].published_at + 60, limit=10)
    assert future == []


async def _read_all(follower: api.Follower, count: int) -> list[api.Delivery]:
    got: list[api.Delivery] = []
    for _ in range(50):
        got += await follower.next()
        if len(got) >= count:
            break
    return got


async def test_follow_reads_in_order_from_a_sequence_a_time_or_the_end(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    assert await bus.stream_bounds(names.stream) == (1, 0)
    for i in range(4):
        await bus.publish(names.subject("n1", "act"), f"a{i}".encode(), msg_id=f"a{i}")
        await bus.publish(names.subject("n2", "act"), f"b{i}".encode(), msg_id=f"b{i}")
    assert await bus.stream_bounds(names.stream) == (1, 8)
    wanted = (names.subject("n1", "*"),)
    from_seq = await bus.follow(names.stream, wanted, api.FollowFrom(sequence=3), batch_size=2, wait_seconds=0.2)
    tail = await bus.follow(names.stream, (names.subject(">"),), api.FollowFrom(), wait_seconds=0.2)
    try:
        assert not await from_seq.caught_up()
        got = await _read_all(from_seq, 3)
        assert [(d.data, d.stream_seq) for d in got] == [(b"a1", 3), (b"a2", 5), (b"a3", 7)]
        assert got[-1].pending == 0 and await from_seq.caught_up()
        assert await from_seq.next() == []  # nothing more within the wait
        from_time = await bus.follow(names.stream, wanted, api.FollowFrom(time=got[1].published_at), wait_seconds=0.2)
        try:
            assert [d.data for d in await _read_all(from_time, 2)] == [b"a2", b"a3"]
        finally:
            await from_time.close()
        assert await tail.next() == []  # the end: only what comes next
        await bus.publish(names.subject("n1", "act"), b"a4", msg_id="a4")
        await bus.publish(names.subject("n2", "act"), b"b4", msg_id="b4")
        assert [d.data for d in await _read_all(tail, 2)] == [b"a4", b"b4"]
        assert [d.data for d in await _read_all(from_seq, 1)] == [b"a4"]
    finally:
        await from_seq.close()
        await tail.close()


async def test_follow_from_a_sequence_no_longer_retained_starts_at_the_oldest(bus: AnyBus, names: Names) -> None:
    await ready(bus, names, max_msgs_per_subject=2)
    for i in range(5):
        await bus.publish(names.subject("k"), f"v{i}".encode(), msg_id=f"v{i}")
    assert await bus.stream_bounds(names.stream) == (4, 5)
    follower = await bus.follow(names.stream, (names.subject("k"),), api.FollowFrom(sequence=1), wait_seconds=0.2)
    try:
        assert [(d.data, d.stream_seq) for d in await _read_all(follower, 2)] == [(b"v3", 4), (b"v4", 5)]
    finally:
        await follower.close()
    with pytest.raises(BusError):
        await bus.follow("NO_SUCH_STREAM", (names.subject(">"),), api.FollowFrom())


async def test_in_flight_publishes_are_bounded(make_bus: BusFactory, names: Names) -> None:
    bus = await make_bus(max_in_flight=4)
    await ready(bus, names)
    acks = await asyncio.gather(*(bus.publish(names.subject("p"), str(i).encode(), msg_id=f"p{i}") for i in range(100)))
    assert sorted(a.seq for a in acks) == list(range(1, 101))
    assert 2 <= bus.in_flight_peak <= 4
    many = await bus.publish_many([(names.subject("q"), str(i).encode(), f"q{i}") for i in range(50)])
    assert [a.seq for a in many] == sorted(a.seq for a in many)
    assert bus.in_flight_peak <= 4
    assert await bus.stream_info(names.stream) == (150, 150)


async def test_wait_idle_reports_pending_work(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    await publish_n(bus, names, 20)

    def slow_retry(d: api.Delivery) -> None:
        if d.data == b"m5":
            raise TemporaryError("later", delay=30)

    rec = Recorder(slow_retry)
    consumer = bus.consume(names.consumer(), rec)
    await wait_until(lambda: len(rec.committed) == 19)
    assert not await consumer.wait_idle(0.5)
    await consumer.stop()

    fine = Recorder()
    other = bus.consume(names.consumer("fine"), fine)
    assert await other.wait_idle(10)
    assert len(fine.committed) == 20
    await other.stop()


async def test_deliver_policies_new_and_last_per_subject(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    for i, token in enumerate(["x", "y", "x", "y", "x"]):
        await bus.publish(names.subject(token), f"{token}{i}".encode(), msg_id=f"lp{i}")

    lasts = Recorder()
    per_subject = bus.consume(names.consumer("lasts", deliver_policy="last_per_subject"), lasts)
    await wait_until(lambda: len(lasts.committed) == 2)

    fresh = Recorder()
    only_new = bus.consume(names.consumer("new", deliver_policy="new"), fresh)
    await asyncio.sleep(0.3)  # let the "new" durable exist before the next publish
    await bus.publish(names.subject("y"), b"y5", msg_id="lp5")
    await wait_until(lambda: len(fresh.committed) == 1 and len(lasts.committed) == 3)
    await per_subject.stop()
    await only_new.stop()
    assert lasts.committed_data() == [b"y3", b"x4", b"y5"]
    assert fresh.committed_data() == [b"y5"]


async def test_linger_gathers_a_trickle_into_few_batches(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)

    class FlushCounter(Recorder):
        flushes = 0

        async def flush(self) -> None:
            if self._batch:
                self.flushes += 1
            await super().flush()

    rec = FlushCounter()
    consumer = bus.consume(names.consumer(linger_seconds=0.3), rec)
    for i in range(30):  # a steady trickle over ~0.6 s
        await bus.publish(names.subject("a"), f"m{i}".encode(), msg_id=f"a-{i}")
        await asyncio.sleep(0.02)
    await wait_until(lambda: len(rec.committed) == 30)
    assert rec.committed_data() == [f"m{i}".encode() for i in range(30)]
    assert rec.flushes <= 5, f"{rec.flushes} flushes for a 0.6 s trickle with a 0.3 s linger"
    loop = asyncio.get_running_loop()
    started = loop.time()
    await consumer.stop()  # stopping while lingering does not wait the linger out
    assert loop.time() - started < 0.25


async def test_connected_says_whether_the_bus_can_be_reached(bus: AnyBus) -> None:
    assert bus.connected
    if isinstance(bus, JetStreamBus):  # what a stop checks before waiting on the bus (a MemoryBus is always there)
        await bus.close()
        assert not bus.connected


async def test_publish_many_if_last_refuses_each_stale_message_alone(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    a, b, c = names.subject("if", "a"), names.subject("if", "b"), names.subject("if", "c")
    first = await bus.publish_many_if_last([(a, b"a1", "a1", 0), (b, b"b1", "b1", 0)])
    assert [(ack.seq, ack.duplicate) for ack in first if ack is not None] == [(1, False), (2, False)]
    second = await bus.publish_many_if_last([(a, b"a2", "a2", 1), (b, b"b-loser", "b-loser", 0), (c, b"c1", "c1", 0)])
    assert [None if ack is None else ack.seq for ack in second] == [3, None, 4]
    # nats-server checks the expectation before the msg id: a resend whose expectation is now stale is refused, one
    # whose expectation still holds is the stored message's duplicate
    assert await bus.publish_many_if_last([(a, b"a2", "a2", 1)]) == [None]
    again = await bus.publish_many_if_last([(a, b"a2", "a2", 3)])
    assert [(ack.seq, ack.duplicate) for ack in again if ack is not None] == [(3, True)]
    assert await bus.publish_many_if_last([]) == []
    last = await bus.last_on_subject(names.stream, b)
    assert last is not None and last.data == b"b1"  # the refused message was not stored
    with pytest.raises(BusUnavailableError):
        await bus.publish_many_if_last([(a, b"ok", "a-ok", 3), (f"o{names.uid}.nowhere", b"x", "o-1", 0)])


async def test_publish_many_acks_in_order_dedups_and_fails_without_a_stream(bus: AnyBus, names: Names) -> None:
    await ready(bus, names)
    first = await bus.publish_many([(names.subject("m"), f"m{i}".encode(), f"m-{i}") for i in range(300)])
    assert [a.seq for a in first] == list(range(1, 301)) and not any(a.duplicate for a in first)
    again = await bus.publish_many([(names.subject("m"), b"x", "m-7"), (names.subject("m"), b"new", "m-new")])
    assert [(a.seq, a.duplicate) for a in again] == [(8, True), (301, False)]
    assert await bus.publish_many([]) == []
    with pytest.raises(BusUnavailableError):
        await bus.publish_many([(names.subject("m"), b"ok", "m-ok"), (f"o{names.uid}.nowhere", b"x", "o-1")])
    assert await bus.stream_info(names.stream) == (302, 302)  # the message with a stream was stored


async def test_request_reply(bus: AnyBus, names: Names) -> None:
    subject = names.subject("rpc", "echo")

    async def echo(data: bytes) -> bytes:
        return b"echo:" + data

    responder = await bus.serve(subject, echo, queue="echo")
    try:
        assert await bus.request(subject, b"hi", timeout=5) == b"echo:hi"
        replies = await asyncio.gather(*(bus.request(subject, str(i).encode(), timeout=5) for i in range(20)))
        assert replies == [f"echo:{i}".encode() for i in range(20)]
    finally:
        await responder.stop()
    with pytest.raises(BusUnavailableError):
        await bus.request(subject, b"nobody", timeout=2)


@pytest.mark.parametrize("concurrency", [1, 4])
async def test_a_responder_answers_up_to_its_concurrency_at_once(bus: AnyBus, names: Names, concurrency: int) -> None:
    subject = names.subject("rpc", "busy")
    running = peak = 0

    async def busy(data: bytes) -> bytes:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await asyncio.sleep(0.05)
        running -= 1
        return data

    responder = await bus.serve(subject, busy, queue="busy", concurrency=concurrency)
    try:
        replies = await asyncio.gather(*(bus.request(subject, str(i).encode(), timeout=5) for i in range(12)))
        assert replies == [str(i).encode() for i in range(12)]
        assert peak == concurrency
    finally:
        await responder.stop()


async def test_request_to_a_failing_handler_is_a_remote_error(bus: AnyBus, names: Names) -> None:
    subject = names.subject("rpc", "broken")

    async def broken(data: bytes) -> bytes:
        raise ValueError(f"cannot take {data!r}")

    responder = await bus.serve(subject, broken, queue="broken")
    try:
        with pytest.raises(RemoteError, match="ValueError: cannot take"):
            await bus.request(subject, b"x", timeout=5)
    finally:
        await responder.stop()


async def test_a_handler_that_finds_the_bus_unavailable_makes_the_request_unavailable(
    bus: AnyBus, names: Names
) -> None:
    """The responder's own publish got no ack in time: the asker hears BusUnavailableError (a 503 at the API, worth
    trying again), not RemoteError (a 502: the responder broke)."""
    subject = names.subject("rpc", "unacked")

    async def unacked(data: bytes) -> bytes:
        raise BusUnavailableError("publish koord.v1.quota.events.default: no ack within 5 s")

    responder = await bus.serve(subject, unacked, queue="unacked")
    try:
        with pytest.raises(BusUnavailableError, match=r"the responder: publish .* no ack") as raised:
            await bus.request(subject, b"x", timeout=5)
        assert raised.value.reason == rpc.RESPONDER  # bus.rpc sends it again only where handling twice is safe
    finally:
        await responder.stop()


async def test_request_times_out_when_the_handler_hangs(bus: AnyBus, names: Names) -> None:
    subject = names.subject("rpc", "slow")
    release = asyncio.Event()

    async def slow(data: bytes) -> bytes:
        await release.wait()
        return data

    responder = await bus.serve(subject, slow, queue="slow")
    try:
        with pytest.raises(BusUnavailableError, match="no answer"):
            await bus.request(subject, b"x", timeout=0.3)
    finally:
        release.set()
        await responder.stop()


async def test_a_stream_subject_transform_stores_each_node_under_its_partition(bus: AnyBus, names: Names) -> None:
    """nats-server's `{{partition(n,1)}}` and bus.subject_transform agree (the memory bus applies the same)."""
    source = names.subject("*", "*")
    destination = names.subject("{{wildcard(1)}}", "{{wildcard(2)}}", "{{partition(8,1)}}")
    await ready(bus, names, subject_transform=(source, destination))
    nodes = [subjects.encode_token(n) for n in ("a", "b", "node-1", "worker-7.example.com", "ip-10-0-0-1")]
    for node in nodes:
        await bus.publish(names.subject(node, "metrics"), b"x", msg_id=node)
    stored = await bus.read_recent(names.stream, names.subject("*", "metrics", "*"), since=0, limit=100)
    expected = {names.subject(n, "metrics", str(subject_transform.partition_of(n, 8))) for n in nodes}
    assert {d.subject for d in stored} == expected
    partition = subject_transform.partition_of(nodes[2], 8)
    only = await bus.read_recent(names.stream, names.subject("*", "metrics", str(partition)), since=0, limit=100)
    assert names.subject(nodes[2], "metrics", str(partition)) in {d.subject for d in only}
    assert len({d.subject.rsplit(".", 1)[1] for d in only}) == 1  # one partition's messages, no other


async def test_a_failed_flush_retried_in_place_keeps_stream_order(bus: AnyBus, names: Names) -> None:
    """retry_flush_in_place (projections that skip by offset): the failing batch is handed over again, unacked and
    not redelivered, until its flush succeeds; messages published meanwhile come after it, never before."""
    await ready(bus, names)
    await publish_n(bus, names, 3)
    rec = Recorder(flush_failures=3)
    consumer = bus.consume(names.consumer(retry_flush_in_place=True), rec)
    await wait_until(lambda: len(rec.seen) >= 6)  # the first batch, failing
    for n in (3, 4):
        await bus.publish(names.subject("m"), f"m{n}".encode(), msg_id=f"{names.stream}-m{n}")
    await wait_until(lambda: len(rec.committed) == 5, timeout=20)
    assert await consumer.wait_idle(5)
    await consumer.stop()
    assert rec.committed_data() == [b"m0", b"m1", b"m2", b"m3", b"m4"]
    assert all(d.num_delivered == 1 for d in rec.committed)
    assert consumer.stats.flush_failures == 3 and consumer.stats.naked == 0 and consumer.stats.acked == 5


@pytest.fixture(params=["memory", "jetstream"])
def koordbus_backend_url(request: pytest.FixtureRequest) -> str | None:
    """None for the MemoryBus, else a private nats-server with koordbus's real streams (their subjects would
    overlap with other tests' streams on the session server)."""
    if request.param == "memory":
        return None
    url: str = request.getfixturevalue("koordbus_nats_url")
    return url


@pytest_asyncio.fixture
async def koordbus_streams_bus(koordbus_backend_url: str | None) -> AsyncIterator[AnyBus]:
    bus: AnyBus
    if koordbus_backend_url is None:
        bus = MemoryBus()
        await bus.ensure_streams(streams.all_streams())
    else:
        bus = await JetStreamBus.connect(koordbus_backend_url, name="contract-koordbus")
    yield bus
    await bus.close()


@pytest.mark.parametrize(
    ("stream", "published"),
    [(streams.KOORD_NODE, subjects.node_metrics), (streams.KOORD_NODEMETRIC, subjects.nodemetric_computed)],
)
async def test_the_partitioned_streams_store_each_node_under_its_partition(
    koordbus_streams_bus: AnyBus, stream: str, published: Callable[[str], str]
) -> None:
    """KOORD_NODE and KOORD_NODEMETRIC as both buses store them: what subjects.stored, partition_filters and
    node_partition say, so a replica's partition filters on either bus see exactly its nodes."""
    bus = koordbus_streams_bus
    nodes = ["a", "node-1", "worker-7.example.com", "ip-10-0-0-1.ec2.internal", "Node_Ü"]
    for node in nodes:
        await bus.publish(published(node), b"{}", msg_id=f"contract-{node}")
    for node in nodes:
        last = await bus.last_on_subject(stream, subjects.stored(published(node)))
        assert last is not None and last.subject == f"{published(node)}.{subjects.node_partition(node)}"
        assert subjects.node_of(last.subject) == node
    every = subjects.NODE_METRICS_ALL if stream == streams.KOORD_NODE else subjects.NODEMETRIC_COMPUTED_ALL
    assert len(await bus.read_recent(stream, every, since=0, limit=100)) == len(nodes)
    for partition in {subjects.node_partition(n) for n in nodes}:
        (only,) = subjects.partition_filters(every, [partition])
        found = {subjects.node_of(d.subject) for d in await bus.read_recent(stream, only, since=0, limit=100)}
        assert found == {n for n in nodes if subjects.node_partition(n) == partition}
