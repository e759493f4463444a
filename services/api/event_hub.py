"""Live event subscriptions for `/api/v1/events/stream` and `/ws`: one shared tail per stream, fanned out to every
subscriber, plus a catch-up read per subscriber that resumes from a cursor or a time.

`EventHub` keeps one follower per stream that any subscription reads (started on first use, kept while the process
runs). Each message is classified and its envelope built once, then offered to every subscription whose filter it
matches, through a bounded queue: the hub never waits for a subscriber — a full queue drops that subscriber, with the
reason, and nobody else notices. `subscribe` registers a subscription with the position each tail has reached;
`events()` first reads each stream from the subscription's start up to that position (its own follower), then
hands out what the tails queued since — nothing is missed or repeated at the seam, and order holds per stream.

Caps: subscriptions in total and per caller (a token's name); past either, `subscribe` raises CapacityError.

`end_streams` ends every subscription at once with a last `shutdown` message (the process is stopping): an open
stream never ends by itself, and the HTTP server's graceful shutdown waits for open responses to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Final, Literal

from bus.api import Bus, Delivery, FollowFrom
from bus.errors import BusError
from services.api import event_catalogue as catalogue

log = logging.getLogger(__name__)

KEEPALIVE_SECONDS: Final = 15.0
CATCH_UP_WAIT_SECONDS: Final = 0.25
"""How long a catch-up read waits for more before it concludes nothing more matches up to the seam."""
TAIL_RETRY_SECONDS: Final = (0.5, 1.0, 2.0, 5.0)


class CapacityError(Exception):
    """Too many subscriptions (in total, or for one caller), or the server is stopping: the message says which."""


@dataclass(frozen=True, kw_only=True)
class Start:
    """Where a subscription begins: after the positions of a cursor, at a time, or (neither) from now."""

    cursor: Mapping[str, int] | None = None
    time: float | None = None


@dataclass(frozen=True, kw_only=True)
class Message:
    """What a subscriber is sent: an event (its id and JSON envelope), a warning, the reason it was dropped, a
    keepalive, or (the last) that the server is stopping."""

    kind: Literal["event", "warning", "dropped", "keepalive", "shutdown"]
    data: bytes = b""
    event_type: str = ""
    id: str = ""


@dataclass(eq=False, kw_only=True)
class Subscription:
    filter: catalogue.EventFilter
    caller: str
    joined: dict[str, int]
    """Per stream, the last sequence the tail had passed on when this subscription joined: catch-up reads up to
    it, the queue holds what comes after."""
    queue: asyncio.Queue[tuple[str, int, str, bytes]]
    dropped: str | None = None
    ended: str | None = None
    """Why the server ended it (it is stopping); the reader stops at its next look."""

    def offer(self, item: tuple[str, int, str, bytes]) -> None:
        if self.dropped is not None:
            return
        try:
            self.queue.put_nowait(item)
        except asyncio.QueueFull:
            self.dropped = f"slow client: {self.queue.maxsize} events queued and not read; reconnect with the last id"

    def end(self, reason: str) -> None:
        """End it: a reader waiting for the next event wakes at once (an empty item) and stops."""
        self.ended = reason
        with contextlib.suppress(asyncio.QueueFull):  # full: the reader is not waiting, and looks before its next
            self.queue.put_nowait(("", 0, "", b""))


class _Tail:
    """One stream's live follower, fanning out to the subscriptions that read the stream."""

    def __init__(self, hub: EventHub, stream: str, position: int) -> None:
        self.stream = stream
        self.position = position
        """The last sequence passed on to subscribers (or, before any, the stream's last at start)."""
        self.subscribers: set[Subscription] = set()
        self._hub = hub
        self._types = tuple(t for t in catalogue.CATALOGUE if t.stream == stream)
        self._task = asyncio.create_task(self._run(), name=f"event-tail-{stream}")

    async def _run(self) -> None:
        subjects = tuple(p for t in self._types for p in t.subjects)
        failures = 0
        follower = None
        while True:
            try:
                if follower is None:
                    follower = await self._hub.bus.follow(
                        self.stream, subjects, FollowFrom(sequence=self.position + 1), batch_size=self._hub.batch_size
                    )
                batch = await follower.next()
                failures = 0
            except asyncio.CancelledError:
                if follower is not None:
                    with contextlib.suppress(Exception):
                        await follower.close()
                raise
            except Exception as e:
                log.warning("event tail of %s: %s; retrying", self.stream, e)
                await asyncio.sleep(TAIL_RETRY_SECONDS[min(failures, len(TAIL_RETRY_SECONDS) - 1)])
                failures += 1
                continue
            for delivery in batch:
                self._pass_on(delivery)

    def _pass_on(self, delivery: Delivery) -> None:
        self.position = delivery.stream_seq
        self._hub.delivered += 1
        if not self.subscribers:
            return
        event = prepare(self.stream, delivery, self._types)
        if event is None:
            return
        event_type, keys, body = event
        item = (self.stream, delivery.stream_seq, event_type.name, body)
        for sub in self.subscribers:
            if event_type in sub.filter.types and sub.filter.matches(keys):
                sub.offer(item)

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def prepare(
    stream: str, delivery: Delivery, types: tuple[catalogue.EventType, ...]
) -> tuple[catalogue.EventType, catalogue.Keys, bytes] | None:
    """The message's type, keys and envelope body; None when it is none of `types`."""
    event_type = catalogue.classify(stream, delivery.subject, types)
    if event_type is None:
        return None
    try:
        keys = event_type.extract(delivery.subject, delivery.data)
    except Exception as e:  # a malformed message still goes out, matching no key filter
        log.warning("event %s seq %d: cannot read its keys: %s", stream, delivery.stream_seq, e)
        keys = {}
    body = catalogue.envelope_body(
        event_type, stream=stream, seq=delivery.stream_seq, time=delivery.published_at, keys=keys, data=delivery.data
    )
    return event_type, keys, body


class EventHub:
    def __init__(
        self,
        bus: Bus,
        *,
        queue_size: int = 10_000,
        max_subscriptions: int = 1000,
        max_per_caller: int = 100,
        batch_size: int = 256,
    ) -> None:
        self.bus = bus
        self.queue_size = queue_size
        self.max_subscriptions = max_subscriptions
        self.max_per_caller = max_per_caller
        self.batch_size = batch_size
        self.delivered = 0
        """Messages the tails have read (for metrics)."""
        self.dropped = 0
        """Subscriptions dropped for falling behind."""
        self._tails: dict[str, _Tail] = {}
        self._subscriptions: set[Subscription] = set()
        self._starting = asyncio.Lock()
        self._ending: str | None = None

    @property
    def subscriptions(self) -> int:
        return len(self._subscriptions)

    async def subscribe(self, event_filter: catalogue.EventFilter, *, caller: str) -> Subscription:
        async with self._starting:
            for stream in event_filter.streams:
                if stream not in self._tails:
                    last = (await self.bus.stream_bounds(stream))[1]
                    if self._ending is not None:  # closed while asking: a tail started now would outlive the hub
                        break
                    self._tails[stream] = _Tail(self, stream, last)
        # from here on nothing awaits: the caps hold however many subscribe at once
        if self._ending is not None:
            raise CapacityError(self._ending)
        if len(self._subscriptions) >= self.max_subscriptions:
            raise CapacityError(f"the API serves at most {self.max_subscriptions} event subscriptions at once")
        mine = sum(1 for s in self._subscriptions if s.caller == caller)
        if mine >= self.max_per_caller:
            raise CapacityError(f"{caller} already has {mine} event subscriptions (at most {self.max_per_caller})")
        sub = Subscription(
            filter=event_filter,
            caller=caller,
            joined={s: self._tails[s].position for s in event_filter.streams},
            queue=asyncio.Queue(self.queue_size),
        )
        for stream in event_filter.streams:
            self._tails[stream].subscribers.add(sub)
        self._subscriptions.add(sub)
        return sub

    def unsubscribe(self, sub: Subscription) -> None:
        self._subscriptions.discard(sub)
        for tail in self._tails.values():
            tail.subscribers.discard(sub)
        if sub.dropped is not None:
            self.dropped += 1

    async def events(
        self, sub: Subscription, start: Start, *, keepalive_seconds: float = KEEPALIVE_SECONDS
    ) -> AsyncIterator[Message]:
        """Catch-up from `start`, then the live events, until the subscription is dropped (its last message says
        why: a full queue, or the log not answering the catch-up) or the caller stops iterating. Unsubscribes at
        the end."""
        positions = dict(sub.joined)
        try:
            try:
                for stream in sub.filter.streams:
                    async for message in self._catch_up(sub, stream, start, positions):
                        yield message
            except BusError as e:  # the subscriber resumes from its last id; a stream that has begun cannot 503
                log.warning("event subscription of %s: the catch-up read failed: %s", sub.caller, e)
                reason = f"the event log did not answer ({e}); reconnect with the last id"
                yield Message(kind="dropped", data=_json({"reason": reason}))
                return
            while sub.dropped is None and sub.ended is None:  # a drop happens only on a full queue: never in get()
                if sub.queue.empty():
                    try:
                        item = await asyncio.wait_for(sub.queue.get(), keepalive_seconds)
                    except TimeoutError:
                        yield Message(kind="keepalive")
                        continue
                else:
                    item = sub.queue.get_nowait()
                stream, seq, type_name, body = item
                if not stream:  # end()'s wake-up
                    break
                positions[stream] = seq
                cursor = catalogue.encode_cursor(positions)
                yield Message(kind="event", id=cursor, event_type=type_name, data=catalogue.envelope(cursor, body))
            if sub.ended is not None:
                yield Message(kind="shutdown", data=_json({"reason": sub.ended}))
            else:
                yield Message(kind="dropped", data=_json({"reason": sub.dropped}))
        finally:
            self.unsubscribe(sub)

    async def _catch_up(
        self, sub: Subscription, stream: str, start: Start, positions: dict[str, int]
    ) -> AsyncIterator[Message]:
        seam = sub.joined[stream]
        if start.cursor is not None:
            if stream not in start.cursor:
                return  # the cursor never read this stream: it starts from now
            begin = FollowFrom(sequence=start.cursor[stream] + 1)
        elif start.time is not None:
            begin = FollowFrom(time=start.time)
        else:
            return
        first, _ = await self.bus.stream_bounds(stream)
        if begin.sequence is not None:
            if begin.sequence > seam:
                return
            if begin.sequence < first:
                yield Message(
                    kind="warning",
                    data=_json(
                        {
                            "message": f"{stream} no longer holds sequences {begin.sequence}..{first - 1}; "
                            f"resuming at the oldest it retains ({first})",
                            "stream": stream,
                            "oldest": first,
                        }
                    ),
                )
        reading = self._matching(stream, sub.filter, begin, through=seam, batch_size=self.batch_size)
        async with contextlib.aclosing(reading):
            async for delivery, event in reading:
                positions[stream] = delivery.stream_seq
                if event is not None:
                    cursor = catalogue.encode_cursor(positions)
                    yield Message(
                        kind="event", id=cursor, event_type=event[0].name, data=catalogue.envelope(cursor, event[2])
                    )
        positions[stream] = max(positions[stream], seam)

    async def _matching(
        self,
        stream: str,
        event_filter: catalogue.EventFilter,
        begin: FollowFrom,
        *,
        through: int,
        batch_size: int,
    ) -> AsyncGenerator[tuple[Delivery, tuple[catalogue.EventType, catalogue.Keys, bytes] | None]]:
        """`stream`'s messages of the filter's subjects from `begin` through sequence `through`, each with its event
        when it matches the filter (None otherwise: a reader still moves its position past it). Ends when the
        follower has handed out everything stored — not at the first empty read, which may only mean a slow
        server."""
        types = tuple(t for t in event_filter.types if t.stream == stream)
        follower = await self.bus.follow(
            stream,
            event_filter.subjects_of(stream),
            begin,
            batch_size=batch_size,
            wait_seconds=CATCH_UP_WAIT_SECONDS,
        )
        try:
            while True:
                batch = await follower.next()
                if not batch:
                    if await follower.caught_up():
                        return
                    continue
                for delivery in batch:
                    if delivery.stream_seq > through:
                        return
                    event = prepare(stream, delivery, types)
                    yield delivery, (event if event is not None and event_filter.matches(event[1]) else None)
                if batch[-1].pending == 0:
                    return
        finally:
            await follower.close()

    async def history(
        self, event_filter: catalogue.EventFilter, start: Start, *, limit: int
    ) -> tuple[list[bytes], str | None, list[str]]:
        """A page of past events, oldest first by stream time: (envelopes, the cursor to ask for the next page or
        None when the page reached the end, warnings). Each stream is read from `start` (default: an hour ago)."""
        since = start.time if start.time is not None else time.time() - 3600
        warnings: list[str] = []
        found: list[tuple[float, str, int, str, bytes]] = []
        ends: dict[str, int] = {}
        begins: dict[str, int] = {}
        exhausted = True
        for stream in event_filter.streams:
            first, last = await self.bus.stream_bounds(stream)
            ends[stream] = last
            if start.cursor is not None and stream in start.cursor:
                begin = FollowFrom(sequence=start.cursor[stream] + 1)
                begins[stream] = start.cursor[stream]
                if start.cursor[stream] + 1 < first:
                    warnings.append(f"{stream} no longer holds sequences {start.cursor[stream] + 1}..{first - 1}")
            else:
                begin = FollowFrom(time=since)
                begins[stream] = first - 1  # refined below from what is read
            if begin.sequence is not None and begin.sequence > last:
                continue
            taken = 0
            reading = self._matching(stream, event_filter, begin, through=last, batch_size=limit + 1)
            async with contextlib.aclosing(reading):
                async for delivery, event in reading:
                    if event is None:
                        continue
                    found.append((delivery.published_at, stream, delivery.stream_seq, event[0].name, event[2]))
                    taken += 1
                    if taken > limit:
                        break
            if taken > limit:
                exhausted = False
            if start.cursor is None or stream not in start.cursor:
                mine = [f[2] for f in found if f[1] == stream]
                begins[stream] = (mine[0] - 1) if mine else last
        found.sort(key=lambda f: (f[0], f[1], f[2]))
        page = found[:limit]
        exhausted = exhausted and len(found) <= limit
        positions = dict(begins)
        envelopes: list[bytes] = []
        for _, stream, seq, _type, body in page:
            positions[stream] = seq
            envelopes.append(catalogue.envelope(catalogue.encode_cursor(positions), body))
        if exhausted:
            positions = {s: ends[s] for s in ends}
            return envelopes, None, warnings
        return envelopes, catalogue.encode_cursor(positions), warnings

    def end_streams(self, reason: str = "the server is stopping: reconnect with the last id") -> None:
        """End every open subscription now (each reader's last message says why) and refuse new ones."""
        self._ending = reason
        for sub in self._subscriptions:
            sub.end(reason)

    async def close(self) -> None:
        self.end_streams()
        async with self._starting:  # a subscribe starting tails finishes first (and then starts no more)
            for tail in self._tails.values():
                await tail.stop()
            self._tails.clear()


def _json(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()
