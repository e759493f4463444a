"""What only the MemoryBus and the shared loop can show quickly: clock-driven limits and the pure retry policy."""

from __future__ import annotations

import msgspec
import pytest

from bus import api
from bus._loop import FLUSH_RETRY_MAX_SECONDS, DeadLetter, Retry, decide, flush_retry_delay, one_line
from bus.errors import BusError, PermanentError, TemporaryError
from bus.jetstream import consumer_config, start_time, stream_config, stream_differs
from bus.memory import MemoryBus, subject_matches
from tests.bus import Names, Recorder, wait_until


class Clock:
    def __init__(self) -> None:
        self.t = 1_700_000_000.0

    def __call__(self) -> float:
        return self.t


@pytest.mark.parametrize(
    ("pattern", "subject", "matches"),
    [
        ("a.b", "a.b", True),
        ("a.*", "a.b", True),
        ("a.*", "a.b.c", False),
        ("a.>", "a.b.c", True),
        ("a.>", "a", False),
        ("*.b.>", "x.b.c", True),
        ("a.b", "a.c", False),
        ("a.b.c", "a.b", False),
    ],
)
def test_subject_matching(pattern: str, subject: str, matches: bool) -> None:
    assert subject_matches(pattern, subject) is matches


def test_decide_maps_errors_to_outcomes() -> None:
    assert decide(TemporaryError("x", delay=3), num_delivered=1, max_deliver=5) == Retry(3)
    assert decide(RuntimeError("bug"), num_delivered=1, max_deliver=5) == Retry(1.0)
    assert decide(PermanentError("no"), num_delivered=1, max_deliver=5) == DeadLetter("PermanentError: no")
    decode = msgspec.DecodeError("bad")
    assert decide(decode, num_delivered=1, max_deliver=5) == DeadLetter("DecodeError: bad")
    gave_up = decide(TemporaryError("busy"), num_delivered=5, max_deliver=5)
    assert gave_up == DeadLetter("gave up after 5 deliveries: TemporaryError: busy")
    assert decide(TemporaryError("busy"), num_delivered=50, max_deliver=-1) == Retry(1.0)


def test_reasons_are_one_bounded_line() -> None:
    reason = one_line("a\nb\r\n  c" + "x" * 5000)
    assert "\n" not in reason and reason.startswith("a b c")
    assert len(reason) == 1000


async def test_max_age_and_dedup_window_follow_the_clock() -> None:
    clock = Clock()
    bus = MemoryBus(now=clock)
    names = Names()
    await bus.ensure_streams([names.stream_spec(max_age_seconds=100.0, duplicate_window_seconds=10.0)])
    await bus.publish(names.subject("a"), b"old", msg_id="m")
    clock.t += 11
    again = await bus.publish(names.subject("a"), b"old", msg_id="m")
    assert not again.duplicate and again.seq == 2
    clock.t += 95
    assert await bus.stream_info(names.stream) == (1, 2)
    clock.t += 10
    assert await bus.stream_info(names.stream) == (0, 2)
    assert await bus.last_on_subject(names.stream, names.subject("a")) is None
    await bus.close()


async def test_unacked_messages_come_back_after_ack_wait() -> None:
    clock = Clock()
    bus = MemoryBus(now=clock)
    names = Names()
    await bus.ensure_streams([names.stream_spec()])
    await bus.publish(names.subject("a"), b"m", msg_id="m")
    durable = bus._new_durable(names.consumer(ack_wait_seconds=30.0))
    (first,) = bus.take(durable, 10)
    assert first.delivery.num_delivered == 1
    assert bus.take(durable, 10) == []
    assert bus.outstanding(durable) == 1
    clock.t += 31
    (second,) = bus.take(durable, 10)
    assert second.delivery.num_delivered == 2
    await second.acker.ack()
    assert bus.outstanding(durable) == 0


async def test_limits_per_subject_and_bytes() -> None:
    bus = MemoryBus()
    names = Names()
    await bus.ensure_streams([names.stream_spec(max_msgs_per_subject=2, max_bytes=10)])
    for i in range(3):
        await bus.publish(names.subject("a"), b"aaaa", msg_id=f"a{i}")
    assert await bus.stream_info(names.stream) == (2, 3)
    await bus.publish(names.subject("b"), b"bbbb", msg_id="b")
    assert await bus.stream_info(names.stream) == (2, 4)  # 12 bytes > 10: the oldest went


async def test_a_stream_asked_for_without_a_cap_keeps_the_one_it_has() -> None:
    bus = MemoryBus()
    names = Names()
    await bus.ensure_streams([names.stream_spec(max_bytes=10)])
    await bus.ensure_streams([names.stream_spec(max_bytes=None)])  # a service joining: the operator's cap stays
    for i in range(3):
        await bus.publish(names.subject("a"), b"aaaa", msg_id=f"a{i}")
    assert await bus.stream_info(names.stream) == (2, 3)
    fresh = Names()
    await bus.ensure_streams([fresh.stream_spec(max_bytes=None)])  # a new stream: no cap
    for i in range(3):
        await bus.publish(fresh.subject("a"), b"aaaa", msg_id=f"a{i}")
    assert await bus.stream_info(fresh.stream) == (3, 3)


async def test_published_bytes_are_copied() -> None:
    bus = MemoryBus()
    names = Names()
    await bus.ensure_streams([names.stream_spec()])
    buffer = bytearray(b"before")
    await bus.publish(names.subject("a"), buffer, msg_id="m")  # type: ignore[arg-type]
    buffer[:] = b"after!"
    last = await bus.last_on_subject(names.stream, names.subject("a"))
    assert last is not None and last.data == b"before"


async def test_dead_letter_without_a_dlq_stream_keeps_the_message() -> None:
    bus = MemoryBus()
    names = Names()
    await bus.ensure_streams([names.stream_spec()])
    await bus.publish(names.subject("a"), b"poison", msg_id="p")

    def poison(d: api.Delivery) -> None:
        raise PermanentError("bad")

    consumer = bus.consume(names.consumer(), Recorder(poison))
    await wait_until(lambda: consumer.stats.naked >= 1)
    await consumer.stop()
    assert consumer.stats.dead_lettered == 0 and consumer.stats.termed == 0
    assert "dead-letter publish failed" in consumer.stats.last_error


async def test_overlapping_streams_are_refused() -> None:
    bus = MemoryBus()
    names = Names()
    await bus.ensure_streams([names.stream_spec()])
    with pytest.raises(BusError):
        await bus.ensure_streams([names.stream_spec(name="OTHER")])


def test_jetstream_config_translation() -> None:
    names = Names()
    want = stream_config(names.stream_spec())
    assert not stream_differs(want, stream_config(names.stream_spec()))
    assert stream_differs(want, stream_config(names.stream_spec(max_age_seconds=5.0)))
    assert stream_differs(want, stream_config(names.stream_spec(subjects=("z.>",))))
    one = consumer_config(names.consumer(filter_subjects=("a.>",)))
    assert one.filter_subject == "a.>" and one.filter_subjects is None
    two = consumer_config(names.consumer(filter_subjects=("a.>", "b.>")))
    assert two.filter_subject is None and two.filter_subjects == ["a.>", "b.>"]
    assert start_time(1.5).timestamp() == pytest.approx(1.499999, abs=1e-9)
    with pytest.raises(BusError):
        consumer_config(names.consumer(deliver_policy="by_start_time"))


def test_flush_retry_delay_doubles_up_to_its_cap_and_jitter_only_shortens_it() -> None:
    assert [flush_retry_delay(n, jitter=0.0) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0]
    assert flush_retry_delay(10_000, jitter=0.0) == FLUSH_RETRY_MAX_SECONDS
    assert flush_retry_delay(3, jitter=1.0) == pytest.approx(2.0 * 0.8)
    assert flush_retry_delay(3, jitter=0.5) == pytest.approx(2.0 * 0.9)
