"""MemoryBus: the Bus interface in process, with JetStream's semantics, for unit tests and fast local runs.

Services' unit tests and `koordbus` dry runs use it instead of `bus.jetstream.JetStreamBus`;
the contract suite (tests/bus) holds both to the same behaviour: subject wildcards, per-stream
sequences, max_age / max_msgs_per_subject / max_bytes limits, msg-id deduplication inside the
window, optimistic concurrency, durable pull consumers with ack / nak(delay) / term, redelivery
after ack_wait, max_deliver and dead-lettering (the loop itself is `bus._loop`). Time comes from
the injectable `now` clock so tests can age messages without sleeping.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from bus import rpc, subject_transform, subjects
from bus._loop import Fetched, LoopConsumer
from bus.api import (
    HEADER_MSG_ID,
    Bus,
    ConsumerSpec,
    Delivery,
    FollowFrom,
    Handler,
    PublishAck,
    PublishOptions,
    RequestHandler,
    StreamSpec,
)
from bus.errors import BusError, BusUnavailableError, ConflictError, RemoteError

Clock = Callable[[], float]
WAKE_INTERVAL_SECONDS = 0.02
"""How often a waiting fetch re-checks for redeliveries that came due (they raise no event)."""


def subject_matches(pattern: str, subject: str) -> bool:
    """NATS wildcard match: `*` is exactly one token, a final `>` is one or more tokens."""
    want = pattern.split(".")
    have = subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(have) == len(want)


@dataclass(frozen=True)
class _Stored:
    seq: int
    subject: str
    data: bytes
    headers: dict[str, str]
    time: float


class _Stream:
    """One stream's messages and limits."""

    def __init__(self, spec: StreamSpec) -> None:
        self.spec = spec
        self.messages: dict[int, _Stored] = {}
        self.by_subject: dict[str, deque[int]] = {}
        self.dedup: dict[str, tuple[int, float]] = {}
        self.last_seq = 0
        self.bytes = 0

    def covers(self, subject: str) -> bool:
        return any(subject_matches(p, subject) for p in self.spec.subjects)

    def prune(self, now: float) -> None:
        window = self.spec.duplicate_window_seconds
        self.dedup = {k: v for k, v in self.dedup.items() if now - v[1] < window}
        max_age = self.spec.max_age_seconds
        if max_age > 0:
            for stored in list(self.messages.values()):
                if now - stored.time < max_age:
                    break
                self._remove(stored.seq)
        if self.spec.max_bytes is not None and self.spec.max_bytes >= 0:
            for seq in list(self.messages):
                if self.bytes <= self.spec.max_bytes:
                    break
                self._remove(seq)

    def append(self, subject: str, data: bytes, headers: dict[str, str], now: float) -> int:
        self.last_seq += 1
        seq = self.last_seq
        self.messages[seq] = _Stored(seq=seq, subject=subject, data=data, headers=headers, time=now)
        self.bytes += len(data)
        seqs = self.by_subject.setdefault(subject, deque())
        seqs.append(seq)
        limit = self.spec.max_msgs_per_subject
        while limit > 0 and len(seqs) > limit:
            self._remove(seqs[0])
        return seq

    def last_seq_on(self, subject: str) -> int:
        """The last sequence stored on `subject`, which may hold wildcards (0: none)."""
        if "*" in subject or ">" in subject:
            return max((seqs[-1] for s, seqs in self.by_subject.items() if subject_matches(subject, s)), default=0)
        seqs = self.by_subject.get(subject)
        return seqs[-1] if seqs else 0

    def _remove(self, seq: int) -> None:
        stored = self.messages.pop(seq)
        self.bytes -= len(stored.data)
        seqs = self.by_subject[stored.subject]
        seqs.remove(seq)
        if not seqs:
            del self.by_subject[stored.subject]


@dataclass
class _Pending:
    num_delivered: int
    due: float
    """When it may be delivered again (ack_wait expiry, or the nak delay)."""


@dataclass
class _Durable:
    """Server-side state of one durable consumer; survives consumer loops, like a JetStream durable."""

    spec: ConsumerSpec
    next_seq: int
    first_only: frozenset[int] = frozenset()
    """deliver_policy last_per_subject: below `start_last`, only these sequences are delivered."""
    start_last: int = 0
    pending: dict[int, _Pending] = field(default_factory=dict)

    def wants(self, stored: _Stored) -> bool:
        if stored.seq <= self.start_last and stored.seq not in self.first_only:
            return False
        return any(subject_matches(f, stored.subject) for f in self.spec.filter_subjects)


class MemoryBus:
    """In-process bus; see the module docstring. `now` is the clock for ages, windows and redelivery."""

    def __init__(self, *, now: Clock = time.time, max_in_flight: int = 1024) -> None:
        self._now = now
        self._streams: dict[str, _Stream] = {}
        self._durables: dict[tuple[str, str], _Durable] = {}
        self._consumers: list[LoopConsumer] = []
        self._in_flight_bound = asyncio.Semaphore(max_in_flight)
        self._in_flight = 0
        self.in_flight_peak = 0
        """Most publishes outstanding at once: instrumentation for the in-flight bound."""
        self._changed = asyncio.Event()
        self._responders: dict[str, list[_MemoryResponder]] = {}
        self._turn = 0

    # --- streams

    async def ensure_streams(self, specs: Iterable[StreamSpec]) -> None:
        for spec in specs:
            self._check_subjects_free(spec)
            stream = self._streams.get(spec.name)
            if spec.max_bytes is None:  # the server's: kept (bus.jetstream.stream_config)
                spec = replace(spec, max_bytes=stream.spec.max_bytes if stream is not None else -1)
            if stream is None:
                self._streams[spec.name] = _Stream(spec)
            elif stream.spec != spec:
                stream.spec = spec
                stream.prune(self._now())

    def _check_subjects_free(self, spec: StreamSpec) -> None:
        for other in self._streams.values():
            if other.spec.name != spec.name and set(other.spec.subjects) & set(spec.subjects):
                raise BusError(f"stream {spec.name}: subjects overlap with stream {other.spec.name}")

    async def stream_info(self, stream: str) -> tuple[int, int]:
        s = self._stream(stream)
        s.prune(self._now())
        return len(s.messages), s.last_seq

    async def stream_bounds(self, stream: str) -> tuple[int, int]:
        s = self._stream(stream)
        s.prune(self._now())
        return (next(iter(s.messages)) if s.messages else s.last_seq + 1), s.last_seq

    async def follow(
        self,
        stream: str,
        filter_subjects: Sequence[str],
        start: FollowFrom,
        *,
        batch_size: int = 256,
        wait_seconds: float = 1.0,
    ) -> _MemoryFollower:
        s = self._stream(stream)
        s.prune(self._now())
        if start.sequence is not None:
            first = start.sequence
        elif start.time is not None:
            first = next((m.seq for m in s.messages.values() if m.time >= start.time), s.last_seq + 1)
        else:
            first = s.last_seq + 1
        return _MemoryFollower(self, s, tuple(filter_subjects), first, batch_size=batch_size, wait_seconds=wait_seconds)

    async def last_on_subject(self, stream: str, subject: str, *, direct: bool = False) -> Delivery | None:
        s = self._stream(stream)
        s.prune(self._now())
        seq = s.last_seq_on(subject)
        if not seq:
            return None
        return _delivery(s.messages[seq], num_delivered=1)

    async def read_recent(self, stream: str, subject: str, *, since: float, limit: int) -> list[Delivery]:
        s = self._stream(stream)
        s.prune(self._now())
        matching = [m for m in s.messages.values() if m.time >= since and subject_matches(subject, m.subject)]
        return [_delivery(m, num_delivered=1) for m in matching[-limit:]] if limit > 0 else []

    def _stream(self, name: str) -> _Stream:
        try:
            return self._streams[name]
        except KeyError:
            raise BusError(f"stream {name} not found") from None

    @property
    def connected(self) -> bool:
        return True

    # --- publishing

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, options: PublishOptions | None = None
    ) -> PublishAck:
        subjects.check_publishable(subject)  # as JetStreamBus: nats-server would drop the connection
        async with self._in_flight_bound:
            self._in_flight += 1
            self.in_flight_peak = max(self.in_flight_peak, self._in_flight)
            try:
                # Yield as a network round-trip would, so concurrent publishers really overlap.
                await asyncio.sleep(0)
                return self._store(subject, bytes(data), msg_id, options or PublishOptions())
            finally:
                self._in_flight -= 1

    async def publish_many(self, messages: Sequence[tuple[str, bytes, str]]) -> list[PublishAck]:
        for subject, _, _ in messages:  # as JetStreamBus: the batch fails whole, before anything is stored
            subjects.check_publishable(subject)
        return list(await asyncio.gather(*(self.publish(s, d, msg_id=m) for s, d, m in messages)))

    async def publish_many_if_last(self, messages: Sequence[tuple[str, bytes, str, int]]) -> list[PublishAck | None]:
        for subject, _, _, _ in messages:
            subjects.check_publishable(subject)

        async def one(subject: str, data: bytes, mid: str, expected: int) -> PublishAck | None:
            try:
                return await self.publish(
                    subject, data, msg_id=mid, options=PublishOptions(expected_last_subject_seq=expected)
                )
            except ConflictError:
                return None

        return list(await asyncio.gather(*(one(*message) for message in messages)))

    def _store(self, subject: str, data: bytes, msg_id: str, options: PublishOptions) -> PublishAck:
        stream = next((s for s in self._streams.values() if s.covers(subject)), None)
        if stream is None:
            raise BusUnavailableError(f"no stream for subject {subject}")
        now = self._now()
        stream.prune(now)
        stored_as = subject  # as nats-server stores it: after the stream's subject transform
        if stream.spec.subject_transform is not None:
            stored_as = subject_transform.apply(*stream.spec.subject_transform, subject) or subject
        expected = options.expected_last_subject_seq
        if expected is not None and stream.last_seq_on(stored_as) != expected:  # as nats-server: before the msg id
            raise ConflictError(
                f"wrong last sequence on {subject}: {stream.last_seq_on(stored_as)}, expected {expected}",
                subject=subject,
                expected=expected,
            )
        seen = stream.dedup.get(msg_id) if msg_id else None
        if seen is not None:
            return PublishAck(stream=stream.spec.name, seq=seen[0], duplicate=True)
        headers = dict(options.headers)
        if msg_id:
            headers[HEADER_MSG_ID] = msg_id
        seq = stream.append(stored_as, data, headers, now)
        if msg_id:
            stream.dedup[msg_id] = (seq, now)
        stream.prune(now)
        self._wake()
        return PublishAck(stream=stream.spec.name, seq=seq)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    # --- consuming

    def consume(self, spec: ConsumerSpec, handler: Handler, *, reset: bool = False) -> LoopConsumer:
        key = (spec.stream, spec.durable)
        if reset:
            self._durables.pop(key, None)
        durable = self._durables.get(key)
        if durable is None:
            durable = self._new_durable(spec)
            self._durables[key] = durable
        else:
            durable.spec = spec
        consumer = LoopConsumer(_MemorySource(self, durable), handler, spec, publish_dead_letter=self._publish_dlq)
        self._consumers.append(consumer)
        return consumer

    async def _publish_dlq(self, subject: str, data: bytes, msg_id: str, headers: Mapping[str, str]) -> PublishAck:
        return await self.publish(subject, data, msg_id=msg_id, options=PublishOptions(headers=headers))

    def _new_durable(self, spec: ConsumerSpec) -> _Durable:
        stream = self._stream(spec.stream)
        stream.prune(self._now())
        match spec.deliver_policy:
            case "all":
                return _Durable(spec=spec, next_seq=1)
            case "new":
                return _Durable(spec=spec, next_seq=stream.last_seq + 1)
            case "by_start_time":
                start = spec.opt_start_time or 0.0
                first = next((m.seq for m in stream.messages.values() if m.time >= start), stream.last_seq + 1)
                return _Durable(spec=spec, next_seq=first)
            case "by_start_sequence":
                return _Durable(spec=spec, next_seq=max(spec.opt_start_seq or 1, 1))
            case "last_per_subject":
                lasts = frozenset(seqs[-1] for seqs in stream.by_subject.values())
                return _Durable(spec=spec, next_seq=1, first_only=lasts, start_last=stream.last_seq)

    def take(self, durable: _Durable, limit: int) -> list[Fetched]:
        """Deliver up to `limit` messages: due redeliveries first, then new ones within max_ack_pending."""
        stream = self._stream(durable.spec.stream)
        now = self._now()
        stream.prune(now)
        out: list[tuple[_Stored, _Pending]] = []
        for seq in sorted(durable.pending):
            if len(out) >= limit:
                break
            p = durable.pending[seq]
            stored = stream.messages.get(seq)
            if stored is None:
                del durable.pending[seq]
            elif p.due <= now and p.num_delivered >= durable.spec.max_deliver > 0:
                # Like JetStream: the last allowed delivery went unsettled, so it is dropped, not redelivered.
                del durable.pending[seq]
            elif p.due <= now:
                out.append(self._hand_out(durable, stored, p, now))
        while len(out) < limit and durable.next_seq <= stream.last_seq:
            if len(durable.pending) >= durable.spec.max_ack_pending:
                break
            stored = stream.messages.get(durable.next_seq)
            durable.next_seq += 1
            if stored is not None and durable.wants(stored):
                p = durable.pending[stored.seq] = _Pending(num_delivered=0, due=now)
                out.append(self._hand_out(durable, stored, p, now))
        if not out:
            return []
        # Like JetStream's num_pending: what is still to be sent after each message (the batch's later new ones too).
        unsent = self._unsent(stream, durable)
        new_after = sum(1 for _, p in out if p.num_delivered == 1)
        batch: list[Fetched] = []
        for stored, p in out:
            if p.num_delivered == 1:
                new_after -= 1
            delivery = _delivery(stored, num_delivered=p.num_delivered, pending=unsent + new_after)
            batch.append(Fetched(delivery, _MemoryAcker(self, durable, stored.seq)))
        return batch

    @staticmethod
    def _hand_out(durable: _Durable, stored: _Stored, p: _Pending, now: float) -> tuple[_Stored, _Pending]:
        p.num_delivered += 1
        p.due = now + durable.spec.ack_wait_seconds
        return stored, p

    def _unsent(self, stream: _Stream, durable: _Durable) -> int:
        return sum(1 for seq in range(durable.next_seq, stream.last_seq + 1) if self._wanted(stream, durable, seq))

    def outstanding(self, durable: _Durable) -> int:
        stream = self._stream(durable.spec.stream)
        stream.prune(self._now())
        return self._unsent(stream, durable) + len(durable.pending)

    @staticmethod
    def _wanted(stream: _Stream, durable: _Durable, seq: int) -> bool:
        stored = stream.messages.get(seq)
        return stored is not None and durable.wants(stored)

    def settle(self, durable: _Durable, seq: int, *, redeliver_in: float | None) -> None:
        """ack/term (redeliver_in None) or nak with a delay."""
        p = durable.pending.get(seq)
        if p is None:
            return
        if redeliver_in is None or p.num_delivered >= durable.spec.max_deliver > 0:
            del durable.pending[seq]
        else:
            p.due = self._now() + redeliver_in
            self._wake()

    def extend(self, durable: _Durable, seq: int) -> None:
        """Work in progress: the message's ack_wait starts again."""
        p = durable.pending.get(seq)
        if p is not None:
            p.due = self._now() + durable.spec.ack_wait_seconds

    async def wait_for_change(self, timeout: float) -> None:
        changed = self._changed
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout=min(timeout, WAKE_INTERVAL_SECONDS))

    # --- request / reply

    async def serve(
        self, subject: str, handler: RequestHandler, *, queue: str, concurrency: int = 1
    ) -> _MemoryResponder:
        responder = _MemoryResponder(self, subject, handler, concurrency=concurrency)
        self._responders.setdefault(subject, []).append(responder)
        return responder

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        subjects.check_publishable(subject)
        candidates = self._responders.get(subject)
        if not candidates:
            raise BusUnavailableError(f"request {subject}: nobody serves this subject", reason=rpc.NO_RESPONDERS)
        self._turn += 1
        responder = candidates[self._turn % len(candidates)]
        try:
            return await asyncio.wait_for(responder.answer(bytes(data)), timeout)
        except TimeoutError:
            raise BusUnavailableError(
                f"request {subject}: no answer within {timeout:g} s", reason=rpc.NO_ANSWER
            ) from None
        except BusUnavailableError as e:
            raise BusUnavailableError(f"request {subject}: the responder: {e}", reason=rpc.RESPONDER) from e
        except Exception as e:
            raise RemoteError(f"{subject}: {type(e).__name__}: {e}") from e

    def _unserve(self, responder: _MemoryResponder) -> None:
        held = self._responders.get(responder.subject, [])
        if responder in held:
            held.remove(responder)

    async def close(self) -> None:
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            await consumer.stop()
        self._responders.clear()


class _MemoryResponder:
    def __init__(self, bus: MemoryBus, subject: str, handler: RequestHandler, *, concurrency: int) -> None:
        self._bus = bus
        self.subject = subject
        self.handler = handler
        self._slots = asyncio.Semaphore(max(1, concurrency))

    async def answer(self, data: bytes) -> bytes:
        async with self._slots:
            return await self.handler(data)

    async def stop(self) -> None:
        self._bus._unserve(self)


class _MemoryFollower:
    def __init__(
        self,
        bus: MemoryBus,
        stream: _Stream,
        filters: tuple[str, ...],
        first_seq: int,
        *,
        batch_size: int,
        wait_seconds: float,
    ) -> None:
        self._bus = bus
        self._stream = stream
        self._filters = filters
        self._next_seq = first_seq
        self._batch_size = batch_size
        self._wait_seconds = wait_seconds
        self._closed = False

    def _take(self) -> list[Delivery]:
        self._stream.prune(self._bus._now())
        matching = [
            m
            for m in self._stream.messages.values()
            if m.seq >= self._next_seq and any(subject_matches(f, m.subject) for f in self._filters)
        ]
        batch = matching[: self._batch_size]
        if batch:
            self._next_seq = batch[-1].seq + 1
        return [_delivery(m, num_delivered=1, pending=len(matching) - i - 1) for i, m in enumerate(batch)]

    async def next(self) -> list[Delivery]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._wait_seconds
        while not self._closed:
            batch = self._take()
            remaining = deadline - loop.time()
            if batch or remaining <= 0:
                return batch
            await self._bus.wait_for_change(remaining)
        return []

    async def caught_up(self) -> bool:
        return not any(
            m.seq >= self._next_seq and any(subject_matches(f, m.subject) for f in self._filters)
            for m in self._stream.messages.values()
        )

    async def close(self) -> None:
        self._closed = True


def _delivery(stored: _Stored, *, num_delivered: int, pending: int = -1) -> Delivery:
    return Delivery(
        subject=stored.subject,
        data=stored.data,
        headers=dict(stored.headers),
        stream_seq=stored.seq,
        num_delivered=num_delivered,
        published_at=stored.time,
        pending=pending,
    )


class _MemoryAcker:
    def __init__(self, bus: MemoryBus, durable: _Durable, seq: int) -> None:
        self._bus = bus
        self._durable = durable
        self._seq = seq

    async def ack(self) -> None:
        self._bus.settle(self._durable, self._seq, redeliver_in=None)

    async def term(self) -> None:
        self._bus.settle(self._durable, self._seq, redeliver_in=None)

    async def nak(self, delay: float) -> None:
        self._bus.settle(self._durable, self._seq, redeliver_in=delay)

    async def in_progress(self) -> None:
        self._bus.extend(self._durable, self._seq)


class _MemorySource:
    def __init__(self, bus: MemoryBus, durable: _Durable) -> None:
        self._bus = bus
        self._durable = durable

    async def fetch(self) -> list[Fetched]:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._durable.spec.fetch_timeout_seconds
        while True:
            batch = self._bus.take(self._durable, self._durable.spec.batch_size)
            remaining = deadline - loop.time()
            if batch or remaining <= 0:
                return batch
            await self._bus.wait_for_change(remaining)

    async def outstanding(self) -> int:
        return self._bus.outstanding(self._durable)

    async def close(self) -> None:
        return None


def _implements_bus(bus: MemoryBus) -> Bus:
    """Never called: mypy proves here that MemoryBus satisfies the Bus protocol."""
    return bus
