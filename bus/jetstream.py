"""JetStreamBus: the Bus interface over NATS JetStream with nats-py.

The composition root (`koordbus up`, `koordbus service …`) connects one per process and hands
it to the services, which see only `bus.api.Bus`. Publishes are pipelined
requests inside an in-flight bound; consumers are durable pull consumers driven by the
shared loop in `bus._loop`; nats-py errors are mapped to `bus.errors` here and nowhere else.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
import functools
import itertools
import json
import logging
import math
import random
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import api as js_api
from nats.js.client import JetStreamContext

from bus import retry, rpc, subjects
from bus._loop import Fetched, LoopConsumer
from bus.api import (
    HEADER_MSG_ID,
    HEADER_RPC_ERROR,
    UNAVAILABLE_PREFIX,
    Bus,
    ConsumerSpec,
    ConsumerStats,
    Delivery,
    FollowFrom,
    Handler,
    PublishAck,
    PublishOptions,
    RequestHandler,
    StreamSpec,
)
from bus.errors import BusError, BusUnavailableError, ConflictError, PayloadTooLargeError, RemoteError

log = logging.getLogger(__name__)
T = TypeVar("T")

HEADER_EXPECTED_LAST_SUBJECT_SEQ = "Nats-Expected-Last-Subject-Sequence"
ERR_WRONG_LAST_SEQUENCE = frozenset({10071, 10164})
"""A publish's expected last sequence did not hold: 10071 from the stored messages, 10164 (a replicated stream)
against another publish to the subject still being proposed."""
ERR_STREAM_NOT_FOUND = 10059
ERR_CONSUMER_NOT_FOUND = 10014
PUBLISH_TIMEOUT_SECONDS = 10.0
NO_RESPONDERS_STATUS = "503"
"""The status header NATS answers a request with when nothing listens on the subject (no stream)."""
API_TIMEOUT_SECONDS = 5.0
ACK_CONFIRM_SECONDS = 2.0
"""On a cluster, an ack the server has not confirmed this long after it was sent is sent again (_PullSource.ack)."""
READ_RECENT_BATCH = 256
READ_RECENT_INACTIVE_SECONDS = 10.0
"""An ephemeral reader left behind by a dropped connection is removed by the server after this long."""
FOLLOW_INACTIVE_SECONDS = 60.0
"""A follower's consumer outlives a reader that stops pulling for this long (a slow API client) — and if the
server deletes it anyway, the follower makes a new one from where it was."""
FOLLOW_DELETE_SECONDS = 1.0
"""How long closing a follower waits for its consumer's deletion: the server deletes an unused one after
FOLLOW_INACTIVE_SECONDS anyway, and a close while the server is away must not wait for the request timeout (it
held a shutdown past its deadline)."""
RESPONDER_DRAIN_SECONDS = 2.0
"""How long stopping a responder waits for its subscription's drain (the server's answer to a flush)."""
PING_INTERVAL_SECONDS = 20.0
MAX_OUTSTANDING_PINGS = 3
"""A connection whose PINGs go unanswered this many times in a row is taken as dead and reconnected: within about
80 s, rather than nats-py's default 6 minutes, whatever stopped its replies (a server stalled, a read loop ended)."""

_EPOCH = datetime.datetime(1970, 1, 1, tzinfo=datetime.UTC)
_UNAVAILABLE = (
    nats.errors.TimeoutError,
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.ConnectionReconnectingError,
    nats.errors.StaleConnectionError,
    nats.errors.OutboundBufferLimitError,
    nats.js.errors.NoStreamResponseError,
    nats.js.errors.ServiceUnavailableError,
    TimeoutError,
)


class _Client(Client):
    """nats-py's client with its PONG bookkeeping made safe.

    A PONG answers the oldest PING still open. nats-py 2.16 sets that PING's future's result unconditionally, but a
    flush that timed out (its own, or the one nats-py runs when it reconnects under load) has cancelled the future:
    the InvalidStateError ended the connection's read loop without a word, and the client stayed "connected" while
    it read nothing any more (tests/bus/test_liveness_bus.py reproduces it with a paused server)."""

    closing = False
    """Set by JetStreamBus.close: a reconnect attempt from then on ends the reconnect loop."""

    async def _connect_to_server(self, s: Any) -> None:
        # close() cancels the reconnect loop, but Python 3.11's wait_for (nats-py's connect timeout) swallows a
        # cancellation that lands as a refused attempt completes: the loop then went on retrying a server that was
        # gone, and asyncio.run's cleanup waited for it forever (`koordbus up` after SIGTERM to it and its server).
        if self.closing:
            raise asyncio.CancelledError
        await super()._connect_to_server(s)

    async def _process_pong(self) -> None:
        if self._pongs and self._pongs[0].done():
            self._pongs.pop(0)
            self._pongs_received += 1
            self._pings_outstanding = 0
            return
        await super()._process_pong()


def stream_config(spec: StreamSpec, have: js_api.StreamConfig | None = None) -> js_api.StreamConfig:
    """The configuration `spec` asks for, on top of the stream's current one, `have` (None: a new stream)."""
    max_bytes = spec.max_bytes
    if max_bytes is None:  # the server's: kept
        max_bytes = (have.max_bytes or -1) if have is not None else -1
    return js_api.StreamConfig(
        name=spec.name,
        subjects=list(spec.subjects),
        max_age=spec.max_age_seconds,
        max_bytes=max_bytes,
        max_msgs_per_subject=spec.max_msgs_per_subject,
        duplicate_window=spec.duplicate_window_seconds,
        num_replicas=spec.replicas,
        storage=js_api.StorageType(spec.storage),
        allow_direct=spec.allow_direct or None,
        subject_transform=(
            js_api.SubjectTransform(src=spec.subject_transform[0], dest=spec.subject_transform[1])
            if spec.subject_transform
            else None
        ),
    )


def stream_differs(have: js_api.StreamConfig, want: js_api.StreamConfig) -> bool:
    """Compare only the fields we set; the server fills in the rest."""
    return (
        sorted(have.subjects or []) != sorted(want.subjects or [])
        or _seconds_differ(have.max_age, want.max_age)
        or _seconds_differ(have.duplicate_window, want.duplicate_window)
        or (have.max_bytes or -1) != want.max_bytes
        or have.max_msgs_per_subject != want.max_msgs_per_subject
        or (have.num_replicas or 1) != want.num_replicas
        or have.storage != want.storage
        or bool(have.allow_direct) != bool(want.allow_direct)
        or _transform(have) != _transform(want)
    )


def _transform(config: js_api.StreamConfig) -> tuple[str, str] | None:
    transform = config.subject_transform
    return (transform.src, transform.dest) if transform is not None else None


def _seconds_differ(a: float | None, b: float | None) -> bool:
    return abs((a or 0.0) - (b or 0.0)) > 1e-6


def consumer_config(spec: ConsumerSpec) -> js_api.ConsumerConfig:
    filters = list(spec.filter_subjects)
    start = None
    if spec.deliver_policy == "by_start_time":
        if spec.opt_start_time is None:
            raise BusError(f"consumer {spec.durable}: deliver_policy by_start_time needs opt_start_time")
        start = start_time(spec.opt_start_time)
    if spec.deliver_policy == "by_start_sequence" and not spec.opt_start_seq:
        raise BusError(f"consumer {spec.durable}: deliver_policy by_start_sequence needs opt_start_seq >= 1")
    return js_api.ConsumerConfig(
        name=spec.durable,
        durable_name=spec.durable,
        deliver_policy=js_api.DeliverPolicy(spec.deliver_policy),
        opt_start_time=start,
        opt_start_seq=spec.opt_start_seq if spec.deliver_policy == "by_start_sequence" else None,
        ack_policy=js_api.AckPolicy.EXPLICIT,
        ack_wait=spec.ack_wait_seconds,
        max_deliver=spec.max_deliver,
        max_ack_pending=spec.max_ack_pending,
        # More than one filter needs nats-server 2.10+ and the plural field.
        filter_subject=filters[0] if len(filters) == 1 else None,
        filter_subjects=filters if len(filters) > 1 else None,
        inactive_threshold=spec.inactive_threshold_seconds,
    )


def start_time(unix_seconds: float) -> datetime.datetime:
    """opt_start_time for the server, one microsecond early.

    Stored times are nanoseconds; a float `published_at` can round a hair above the true time, and
    starting exactly there would skip the very message it came from.
    """
    micros = math.floor(unix_seconds * 1_000_000) - 1
    return _EPOCH + datetime.timedelta(microseconds=micros)


def _timestamp(value: datetime.datetime | None) -> float:
    return value.timestamp() if value is not None else 0.0


class JetStreamBus:
    """See the module docstring. Build with `await JetStreamBus.connect(url, name=…)`."""

    def __init__(self, nc: Client, *, max_in_flight: int = 1024, link: Link | None = None) -> None:
        self._nc = nc
        self.link = link or Link()
        """The connection's state (down since when, closed under us and why), kept by `connect`'s callbacks."""
        self._js: JetStreamContext = nc.jetstream(timeout=API_TIMEOUT_SECONDS)
        self._in_flight_bound = asyncio.Semaphore(max_in_flight)
        self._in_flight = 0
        self.in_flight_peak = 0
        """Most publishes outstanding at once: instrumentation for the in-flight bound."""
        self.publish_retries: collections.Counter[str] = collections.Counter()
        """Publishes sent again because the cluster could not take them (bus.retry), by bus.retry.Failure value."""
        self._consumers: list[LoopConsumer] = []
        self._ack_prefix: str | None = None
        self._ack_tokens = itertools.count()
        self._ack_waiters: dict[str, asyncio.Future[Msg]] = {}

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        name: str,
        max_in_flight: int = 1024,
        user: str | None = None,
        password: str | None = None,
        token: Callable[[], str] | None = None,
        ping_interval: float = PING_INTERVAL_SECONDS,
    ) -> JetStreamBus:
        """Connect to `url` (a NATS cluster's servers comma-separated: any of them, the others for reconnects) as
        `user` when given, or with the token `token()` returns, asked again at every reconnect: a Kubernetes token
        file rotates; and keep reconnecting forever (with nats-py's backoff) if the server goes
        away or stops answering PINGs (MAX_OUTSTANDING_PINGS × `ping_interval`)."""

        async def on_error(e: Exception) -> None:
            log.warning("nats %s: %s", name, e)

        link = Link()

        async def on_disconnected() -> None:
            log.warning("nats %s: disconnected from %s", name, url)
            link.disconnected(time.monotonic())

        async def on_reconnected() -> None:
            log.info("nats %s: reconnected", name)
            link.reconnected()

        async def on_closed() -> None:
            if not link.closing:  # nats-py never reuses a closed client: the process has lost its bus for good
                reason = str(nc.last_error) if nc.last_error else "closed"
                log.error("nats %s: the connection to %s was closed for good: %s", name, url, reason)
                link.lost(reason)

        nc = _Client()
        try:
            await nc.connect(
                [u.strip() for u in url.split(",")] if "," in url else url,
                name=name,
                ping_interval=ping_interval,  # type: ignore[arg-type]  # an int in nats-py's hints; a sleep's delay
                max_outstanding_pings=MAX_OUTSTANDING_PINGS,
                max_reconnect_attempts=-1,
                reconnect_time_wait=1,
                error_cb=on_error,
                disconnected_cb=on_disconnected,
                reconnected_cb=on_reconnected,
                closed_cb=on_closed,
                user=user,
                password=password,
                token=token,
            )
        except (OSError, *_UNAVAILABLE, nats.errors.NoServersError) as e:
            raise BusUnavailableError(f"cannot connect to {url}: {e}") from e
        return cls(nc, max_in_flight=max_in_flight, link=link)

    @property
    def jetstream(self) -> JetStreamContext:
        return self._js

    @property
    def connected(self) -> bool:
        return bool(self._nc.is_connected)

    # --- streams

    async def ensure_streams(self, specs: Iterable[StreamSpec]) -> None:
        """Create each stream, or bring it to its spec. On a cluster, what a forming cluster or an election answers
        (a peer not yet known online, no meta leader for a moment) is retried for up to
        bus.retry.PUBLISH_RETRY_SECONDS per stream."""
        for spec in specs:
            try:
                await self._until_available(functools.partial(self._ensure_stream, spec), f"stream {spec.name}")
            except (nats.js.errors.APIError, *_UNAVAILABLE) as e:
                raise _api_error(e, f"ensure stream {spec.name}") from e

    async def _until_available(self, call: Callable[[], Awaitable[T]], what: str) -> T:
        """`call()`, made again with backoff while a cluster answers "not now" (a forming cluster, an election) for
        up to bus.retry.PUBLISH_RETRY_SECONDS. Only for calls that may be made twice (creating or updating a stream,
        a reader's ephemeral consumer); the last failure is raised as it came."""
        give_up_at = asyncio.get_running_loop().time() + retry.PUBLISH_RETRY_SECONDS
        attempt = 0
        while True:
            try:
                return await call()
            except (nats.js.errors.APIError, *_UNAVAILABLE) as e:
                failure = _failure(e)
                if failure is None or not self._may_retry(failure, {HEADER_MSG_ID: "idempotent"}, give_up_at):
                    raise
                attempt += 1
                log.info("%s: the cluster cannot take it yet (%s); retrying", what, e)
                await self._back_off(failure, attempt)

    async def _ensure_stream(self, spec: StreamSpec) -> None:
        try:
            info = await self._js.stream_info(spec.name)
        except nats.js.errors.NotFoundError:
            await self._js.add_stream(stream_config(spec))
            return
        want = stream_config(spec, info.config)
        if stream_differs(info.config, want):
            log.info("updating stream %s to its spec", spec.name)
            await self._js.update_stream(want)

    async def stream_info(self, stream: str) -> tuple[int, int]:
        info = await self._api(self._js.stream_info(stream), f"stream info {stream}")
        return info.state.messages, info.state.last_seq

    async def last_on_subject(self, stream: str, subject: str, *, direct: bool = False) -> Delivery | None:
        try:
            if direct:  # $JS.API.DIRECT.GET.<stream>.<subject>: a request a permission can name key by key
                raw = await self._js.get_msg(stream, subject=subject, direct=True)
            else:
                raw = await self._js.get_last_msg(stream, subject)
        except nats.js.errors.NotFoundError as e:
            if e.err_code == ERR_STREAM_NOT_FOUND:
                raise BusError(f"stream {stream} not found") from e
            return None
        except _UNAVAILABLE as e:
            raise BusUnavailableError(f"get last message on {subject}: {e}") from e
        except nats.js.errors.APIError as e:
            raise BusError(f"get last message on {subject}: {e}") from e
        return Delivery(
            subject=raw.subject or subject,
            data=bytes(raw.data or b""),
            headers=dict(raw.headers or {}),
            stream_seq=raw.seq or 0,
            num_delivered=1,
            published_at=_timestamp(raw.time),
        )

    async def stream_bounds(self, stream: str) -> tuple[int, int]:
        info = await self._api(self._js.stream_info(stream), f"stream info {stream}")
        state = info.state
        return (state.first_seq if state.messages else state.last_seq + 1), state.last_seq

    async def follow(
        self,
        stream: str,
        filter_subjects: Sequence[str],
        start: FollowFrom,
        *,
        batch_size: int = 256,
        wait_seconds: float = 1.0,
    ) -> _Follower:
        last_seq = (await self.stream_bounds(stream))[1]  # also: BusError now if there is no such stream
        first_seq = last_seq + 1 if start.sequence is None and start.time is None else start.sequence
        return _Follower(
            self._nc,
            self._js,
            stream,
            tuple(filter_subjects),
            first_seq=first_seq,
            first_time=start.time,
            batch_size=batch_size,
            wait_seconds=wait_seconds,
        )

    async def read_recent(self, stream: str, subject: str, *, since: float, limit: int) -> list[Delivery]:
        if limit <= 0:
            return []
        config = js_api.ConsumerConfig(
            deliver_policy=js_api.DeliverPolicy.BY_START_TIME,
            opt_start_time=start_time(since),
            ack_policy=js_api.AckPolicy.NONE,
            inactive_threshold=READ_RECENT_INACTIVE_SECONDS,
            filter_subject=subject,
        )
        newest: collections.deque[Delivery] = collections.deque(maxlen=limit)
        try:
            sub = await self._until_available(
                functools.partial(self._js.pull_subscribe, subject, stream=stream, config=config), f"read {subject}"
            )
        except nats.js.errors.NotFoundError as e:
            raise BusError(f"stream {stream} not found") from e
        except _UNAVAILABLE as e:
            raise BusUnavailableError(f"read {subject}: {e}") from e
        try:
            while pending := (await sub.consumer_info()).num_pending:
                for msg in await sub.fetch(min(pending, READ_RECENT_BATCH), timeout=API_TIMEOUT_SECONDS):
                    newest.append(_delivery(msg))
        except _UNAVAILABLE as e:
            raise BusUnavailableError(f"read {subject}: {e}") from e
        finally:
            with contextlib.suppress(*_UNAVAILABLE, nats.errors.BadSubscriptionError):
                await sub.unsubscribe()
        return list(newest)

    async def _api(self, call: Any, what: str) -> Any:
        try:
            return await call
        except (nats.js.errors.APIError, *_UNAVAILABLE) as e:
            raise _api_error(e, what) from e

    # --- publishing

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, options: PublishOptions | None = None
    ) -> PublishAck:
        subjects.check_publishable(subject)  # a longer one would cost the whole connection
        options = options or PublishOptions()
        headers = dict(options.headers)
        if msg_id:
            headers[HEADER_MSG_ID] = msg_id
        if options.expected_last_subject_seq is not None:
            headers[HEADER_EXPECTED_LAST_SUBJECT_SEQ] = str(options.expected_last_subject_seq)
        async with self._in_flight_bound:
            self._in_flight += 1
            self.in_flight_peak = max(self.in_flight_peak, self._in_flight)
            try:
                ack = await self._publish_once(subject, data, headers)
            finally:
                self._in_flight -= 1
        return PublishAck(stream=ack.stream, seq=ack.seq, duplicate=bool(ack.duplicate))

    async def _publish_once(self, subject: str, data: bytes, headers: dict[str, str]) -> js_api.PubAck:
        # js.publish is a request on the connection's shared reply inbox, so concurrent calls pipeline.
        # (publish_async would too, but nats-py 2.16 raises stream errors inside its reply callback
        # instead of failing the future, so a rejected publish would hang until the timeout.)
        # On a cluster, what a leader election answers is retried (bus.retry).
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + retry.PUBLISH_RETRY_SECONDS
        attempt = 0
        while True:
            try:
                return await self._js.publish(subject, data, timeout=PUBLISH_TIMEOUT_SECONDS, headers=headers)
            except Exception as e:
                failure = _failure(e)
                if failure is None or not self._may_retry(failure, headers, give_up_at):
                    raise _publish_error(e, subject, headers) from e
                attempt += 1
                await self._back_off(failure, attempt)

    def _clustered(self) -> bool:
        """The server we are connected to is a cluster's member (its INFO names the cluster)."""
        info = getattr(self._nc, "_server_info", None) or {}
        return bool(info.get("cluster"))

    def _may_retry(self, failure: retry.Failure, headers: Mapping[str, str], give_up_at: float) -> bool:
        return (
            self._clustered()
            and retry.may_retry(failure, has_msg_id=HEADER_MSG_ID in headers)
            and asyncio.get_running_loop().time() < give_up_at
        )

    async def _back_off(self, failure: retry.Failure, attempt: int) -> None:
        self.publish_retries[failure.value] += 1
        await asyncio.sleep(retry.delay(attempt, jitter=random.random()))

    async def publish_many(self, messages: Sequence[tuple[str, bytes, str]]) -> list[PublishAck]:
        """Pipelined: every message goes out at once (within the in-flight bound) with its own reply subject on one
        shared ack inbox, and the acks are awaited together under one timeout — no task or timer per message, which
        is most of what a single `publish` costs. On a cluster, the messages a leader election refused (or, with a
        msg id, left unanswered) are sent again (bus.retry). The first failed ack raises once all are in."""
        results = await self._publish_pipelined([(subject, data, mid, None) for subject, data, mid in messages])
        acks: list[PublishAck] = []
        for result in results:
            if isinstance(result, Exception):
                raise result
            acks.append(result)
        return acks

    async def publish_many_if_last(self, messages: Sequence[tuple[str, bytes, str, int]]) -> list[PublishAck | None]:
        """As publish_many, each message with `Nats-Expected-Last-Subject-Sequence`; None for each one refused."""
        acks: list[PublishAck | None] = []
        for result in await self._publish_pipelined(messages):
            if isinstance(result, ConflictError):
                acks.append(None)
            elif isinstance(result, Exception):
                raise result
            else:
                acks.append(result)
        return acks

    async def _publish_pipelined(
        self, messages: Sequence[tuple[str, bytes, str, int | None]]
    ) -> list[PublishAck | BusError]:
        """(subject, data, msg id, expected last subject sequence or None) out at once; each one's ack or error."""
        if not messages:
            return []
        for subject, _, _, _ in messages:  # before anything is sent: the batch fails whole, the connection lives
            subjects.check_publishable(subject)
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + retry.PUBLISH_RETRY_SECONDS
        results: list[PublishAck | BusError | None] = [None] * len(messages)
        todo = list(range(len(messages)))
        attempt = 0
        while True:
            replies = await self._publish_round([messages[i] for i in todo])
            again: list[int] = []
            worst: retry.Failure | None = None
            for i, reply in zip(todo, replies, strict=True):
                subject, _, mid, expected = messages[i]
                try:
                    results[i] = _publish_ack(reply, subject, expected)
                    continue
                except BusError as e:
                    results[i] = e
                failure = _reply_failure(reply)
                headers = {HEADER_MSG_ID: mid} if mid else {}
                if failure is not None and self._may_retry(failure, headers, give_up_at):
                    again.append(i)
                    worst = failure
            if not again or worst is None:
                break
            attempt += 1
            await self._back_off(worst, attempt)
            todo = again
        return [r for r in results if r is not None]

    async def _publish_round(self, messages: Sequence[tuple[str, bytes, str, int | None]]) -> list[Msg | None]:
        """Send `messages` and wait for their acks under one timeout; a reply each, None where none came in time."""
        prefix = await self._ack_inbox()
        loop = asyncio.get_running_loop()
        waiting: list[asyncio.Future[Msg]] = []
        tokens: list[str] = []
        try:
            for subject, data, mid, expected in messages:
                await self._in_flight_bound.acquire()
                self._in_flight += 1
                self.in_flight_peak = max(self.in_flight_peak, self._in_flight)
                token = str(next(self._ack_tokens))
                future: asyncio.Future[Msg] = loop.create_future()
                future.add_done_callback(self._release_in_flight)
                self._ack_waiters[token] = future
                waiting.append(future)
                tokens.append(token)
                headers = {HEADER_MSG_ID: mid} if mid else {}
                if expected is not None:
                    headers[HEADER_EXPECTED_LAST_SUBJECT_SEQ] = str(expected)
                await self._nc.publish(subject, data, reply=f"{prefix}.{token}", headers=headers or None)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(PUBLISH_TIMEOUT_SECONDS):
                    await asyncio.wait(waiting)
        except _UNAVAILABLE as e:
            if not self._clustered() or not all(mid for _, _, mid, _ in messages):
                raise BusUnavailableError(f"publish of {len(messages)} messages: {type(e).__name__} {e}") from e
        finally:
            for token in tokens:
                self._ack_waiters.pop(token, None)
        replies = [f.result() if f.done() and not f.cancelled() else None for f in waiting]
        for future in waiting:
            if not future.done():
                future.cancel()
        replies += [None] * (len(messages) - len(replies))  # not even sent: the connection went away
        if not self._clustered() and None in replies:
            missing = f"no ack within {PUBLISH_TIMEOUT_SECONDS:g} s"
            raise BusUnavailableError(f"publish of {len(messages)} messages: {missing}")
        return replies

    async def _ack_inbox(self) -> str:
        """The subject prefix publish_many's acks come back on (one subscription per connection, made once)."""
        if self._ack_prefix is None:
            prefix = self._nc.new_inbox()
            await self._nc.subscribe(f"{prefix}.*", cb=self._on_ack)
            self._ack_prefix = prefix
        return self._ack_prefix

    async def _on_ack(self, msg: Msg) -> None:
        future = self._ack_waiters.pop(msg.subject.rpartition(".")[2], None)
        if future is not None and not future.done():
            future.set_result(msg)

    def _release_in_flight(self, _: object) -> None:
        self._in_flight -= 1
        self._in_flight_bound.release()

    async def _publish_dlq(self, subject: str, data: bytes, msg_id: str, headers: Mapping[str, str]) -> PublishAck:
        return await self.publish(subject, data, msg_id=msg_id, options=PublishOptions(headers=headers))

    # --- consuming

    def consume(self, spec: ConsumerSpec, handler: Handler, *, reset: bool = False) -> LoopConsumer:
        source = _PullSource(self._nc, self._js, spec, reset=reset, confirm_acks=self._clustered)
        consumer = LoopConsumer(source, handler, spec, publish_dead_letter=self._publish_dlq)
        source.stats = consumer.stats
        self._consumers.append(consumer)
        return consumer

    # --- request / reply (core NATS, no stream)

    async def serve(self, subject: str, handler: RequestHandler, *, queue: str, concurrency: int = 1) -> _Responder:
        # nats-py calls a subscription's callback for one message at a time: beyond 1, each answer is a task, and
        # the callback waits for a free slot (the server's queue holds the rest)
        slots = asyncio.Semaphore(max(1, concurrency))
        answering: set[asyncio.Task[None]] = set()

        async def on_request(msg: Msg) -> None:
            if not msg.reply:
                return
            if concurrency <= 1:
                await answer(msg)
                return
            await slots.acquire()
            task = asyncio.create_task(answer(msg))
            answering.add(task)
            task.add_done_callback(answered)

        def answered(task: asyncio.Task[None]) -> None:
            answering.discard(task)
            slots.release()

        async def answer(msg: Msg) -> None:
            try:
                reply = await handler(msg.data)
                headers = None
            except BusUnavailableError as e:  # the bus, not the handler: no traceback to read at 3 a.m.
                log.warning("request handler on %s: %s", subject, e)
                reply, headers = b"", {HEADER_RPC_ERROR: f"{UNAVAILABLE_PREFIX}{e}"[:1000]}
            except Exception as e:
                log.exception("request handler on %s failed", subject)
                reply, headers = b"", {HEADER_RPC_ERROR: f"{type(e).__name__}: {e}"[:1000]}
            try:
                try:
                    await self._nc.publish(msg.reply, reply, headers=headers)
                except nats.errors.MaxPayloadError:  # the asker hears why at once instead of timing out
                    error = f"PayloadTooLargeError: the reply of {len(reply)} bytes is over the bus's max payload"
                    await self._nc.publish(msg.reply, b"", headers={HEADER_RPC_ERROR: error})
            except _UNAVAILABLE as e:
                log.warning("reply on %s not sent: %s", subject, e)

        try:
            sub = await self._nc.subscribe(subject, queue=queue, cb=on_request)
            await self._round_trip()  # the server has the subscription: a request sent after this is served
        except _UNAVAILABLE as e:
            raise BusUnavailableError(f"serve {subject}: {e}") from e
        return _Responder(self._nc, sub, answering)

    async def _round_trip(self) -> None:
        """Return once the server has processed everything this connection sent so far: a message published now came
        back. (nats-py's flush() writes its PING straight to the socket, past a SUB still in nats-py's write buffer,
        so its PONG proves nothing about that SUB; a publish goes through the same buffer, after it.)"""
        inbox = self._nc.new_inbox()
        came_back: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def arrived(_: Msg) -> None:
            if not came_back.done():
                came_back.set_result(None)

        sub = await self._nc.subscribe(inbox, cb=arrived, max_msgs=1)
        try:
            await self._nc.publish(inbox, b"")
            await asyncio.wait_for(came_back, API_TIMEOUT_SECONDS)
        finally:
            with contextlib.suppress(*_UNAVAILABLE, nats.errors.BadSubscriptionError):
                await sub.unsubscribe()

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        subjects.check_publishable(subject)
        try:
            reply = await self._nc.request(subject, data, timeout=timeout)
        except nats.errors.NoRespondersError as e:
            raise BusUnavailableError(f"request {subject}: nobody serves this subject", reason=rpc.NO_RESPONDERS) from e
        except nats.errors.MaxPayloadError as e:
            raise PayloadTooLargeError(f"request {subject}: {len(data)} bytes is over the bus's max payload") from e
        except (nats.errors.TimeoutError, TimeoutError) as e:
            raise BusUnavailableError(f"request {subject}: no answer within {timeout:g} s", reason=rpc.NO_ANSWER) from e
        except _UNAVAILABLE as e:
            raise BusUnavailableError(f"request {subject}: {type(e).__name__} {e}", reason=rpc.CONNECTION) from e
        error = (reply.headers or {}).get(HEADER_RPC_ERROR)
        if error is not None and error.startswith(UNAVAILABLE_PREFIX):
            reason = error.removeprefix(UNAVAILABLE_PREFIX)
            raise BusUnavailableError(f"request {subject}: the responder: {reason}", reason=rpc.RESPONDER)
        if error is not None:
            raise RemoteError(f"{subject}: {error}")
        return bytes(reply.data)

    def stop_consuming(self) -> None:
        """Every consumer of this bus takes no more messages (LoopConsumer.stop_soon); `close` stops them."""
        for consumer in self._consumers:
            consumer.stop_soon()

    async def close(self) -> None:
        self.link.closing = True
        if isinstance(self._nc, _Client):
            self._nc.closing = True
        consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            await consumer.stop()
        if self._nc.is_closed:
            return
        with contextlib.suppress(OSError, *_UNAVAILABLE):  # a server already gone: nothing left to flush to
            await self._nc.close()


class Link:
    """The state of a bus's connection, for liveness (koordbus.runtime): nats-py reconnects by itself while the
    server is away, but a client it has closed (the server dropped the connection for a protocol error, or it gave
    up) is never used again, and nothing of the process reaches the bus from then on."""

    def __init__(self) -> None:
        self.down_since: float | None = None
        """time.monotonic() when the connection went down; None while connected."""
        self.lost_reason = ""
        """Why the client was closed under us (empty while it is not)."""
        self.closing = False
        """Closed by JetStreamBus.close: not a loss."""
        self._lost = asyncio.Event()

    def disconnected(self, now: float) -> None:
        if self.down_since is None:
            self.down_since = now

    def reconnected(self) -> None:
        self.down_since = None

    def lost(self, reason: str) -> None:
        self.lost_reason = reason
        self._lost.set()

    def down_for(self, now: float) -> float:
        """Seconds the connection has been down at `now` (time.monotonic()); 0.0 while connected."""
        return 0.0 if self.down_since is None else max(0.0, now - self.down_since)

    async def wait_lost(self) -> str:
        """Wait until the client is closed under us; the reason."""
        await self._lost.wait()
        return self.lost_reason


class _Responder:
    def __init__(self, nc: Client, sub: Any, answering: set[asyncio.Task[None]]) -> None:
        self._nc = nc
        self._sub = sub
        self._answering = answering

    async def stop(self) -> None:
        # Drained (requests already received are answered) while the server is there; a drain waits for the
        # server's answer to a flush, so without one (the server gone, or going) it would wait out the flush timeout.
        with contextlib.suppress(*_UNAVAILABLE, nats.errors.BadSubscriptionError, TimeoutError):
            if not self._nc.is_connected:
                await self._sub.unsubscribe()
            else:
                async with asyncio.timeout(RESPONDER_DRAIN_SECONDS):
                    await self._sub.drain()
        if self._answering:
            await asyncio.gather(*self._answering, return_exceptions=True)


def _publish_ack(reply: Msg | None, subject: str, expected: int | None) -> PublishAck:
    """The stream's answer to one pipelined publish (`expected`: the last subject sequence it was sent with): its
    PubAck, or the error as the single publish raises it."""
    if reply is None:
        raise BusUnavailableError(f"publish {subject}: no ack within {PUBLISH_TIMEOUT_SECONDS:g} s")
    if (reply.headers or {}).get("Status") == NO_RESPONDERS_STATUS:
        raise BusUnavailableError(f"no stream for subject {subject} (or no server answered)")
    try:
        answer = json.loads(reply.data)
    except ValueError as e:
        raise BusError(f"publish {subject}: unreadable ack {reply.data[:200]!r}") from e
    error = answer.get("error")
    if error is not None:
        text = f"publish {subject}: {error.get('description', error)} (code {error.get('err_code')})"
        if expected is not None and error.get("err_code") in ERR_WRONG_LAST_SEQUENCE:
            raise ConflictError(text, subject=subject, expected=expected)
        if retry.temporary_api_error(error.get("err_code"), str(error.get("description", ""))):
            raise BusUnavailableError(text)
        raise BusError(text)
    return PublishAck(stream=answer["stream"], seq=int(answer["seq"]), duplicate=bool(answer.get("duplicate")))


def _failure(error: Exception) -> retry.Failure | None:
    """What a failed single publish says about the cluster (bus.retry); None: not the cluster's doing."""
    if isinstance(error, nats.errors.NoRespondersError | nats.js.errors.NoStreamResponseError):
        return retry.Failure.NO_RESPONDERS
    if isinstance(error, nats.js.errors.APIError):
        return retry.Failure.UNAVAILABLE if _temporary(error) else None
    if isinstance(
        error,
        nats.errors.TimeoutError
        | TimeoutError
        | nats.errors.ConnectionReconnectingError
        | nats.errors.StaleConnectionError,
    ):
        return retry.Failure.NO_ANSWER
    return None


def _temporary(error: nats.js.errors.APIError) -> bool:
    return error.code == 503 or retry.temporary_api_error(error.err_code, error.description or "")


def _reply_failure(reply: Msg | None) -> retry.Failure | None:
    """What a pipelined publish's reply (None: none came) says about the cluster (bus.retry)."""
    if reply is None:
        return retry.Failure.NO_ANSWER
    if (reply.headers or {}).get("Status") == NO_RESPONDERS_STATUS:
        return retry.Failure.NO_RESPONDERS
    try:
        error = json.loads(reply.data).get("error")
    except (ValueError, AttributeError):
        return None
    if error and retry.temporary_api_error(error.get("err_code"), str(error.get("description", ""))):
        return retry.Failure.UNAVAILABLE
    return None


def _api_error(error: Exception, what: str) -> BusError:
    """A failed JetStream API call as the bus's error: unavailable for what the cluster may take later."""
    if isinstance(error, _UNAVAILABLE) or (isinstance(error, nats.js.errors.APIError) and _temporary(error)):
        return BusUnavailableError(f"{what}: {error}")
    return BusError(f"{what}: {error}")


def _publish_error(error: Exception, subject: str, headers: Mapping[str, str]) -> BusError:
    """A failed single publish as the bus's error."""
    if isinstance(error, nats.js.errors.NoStreamResponseError):
        return BusUnavailableError(f"no stream for subject {subject} (or no server answered)")
    if isinstance(error, _UNAVAILABLE):
        return BusUnavailableError(f"publish {subject}: {type(error).__name__} {error}")
    if isinstance(error, nats.js.errors.APIError):
        if error.err_code in ERR_WRONG_LAST_SEQUENCE:
            expected = int(headers[HEADER_EXPECTED_LAST_SUBJECT_SEQ])
            return ConflictError(f"{subject}: {error.description}", subject=subject, expected=expected)
        if _temporary(error):
            return BusUnavailableError(f"publish {subject}: {error}")
        return BusError(f"publish {subject}: {error}")
    if isinstance(error, BusError):
        return error
    return BusError(f"publish {subject}: {type(error).__name__} {error}")


class _MsgAcker:
    def __init__(self, msg: Msg, source: _PullSource | None = None) -> None:
        self._msg = msg
        self._source = source

    async def ack(self) -> None:
        if self._source is not None:
            await self._source.ack(self._msg)
        else:
            await self._msg.ack()

    async def nak(self, delay: float) -> None:
        await self._msg.nak(delay=delay)

    async def term(self) -> None:
        await self._msg.term()

    async def in_progress(self) -> None:
        await self._msg.in_progress()


class _PullSource:
    """A durable pull consumer, bound lazily on the first fetch (so it retries while the bus is away).

    The pull protocol is spoken directly rather than through nats-py's `fetch`, which waits for each message with
    its own task and timer (most of the cost of consuming a message). Messages of every pull request land through
    one callback subscription on our own inbox into a buffer. Pull requests (batch_size messages each, expiring just
    before the fetch timeout) stay open across fetches: a new one is asked for when the last is over (delivered its
    batch, ended with a status, or past its expiry), or ahead of time when less than half a batch is left on the
    open ones, so a busy stream flows without a round trip between batches. A fetch hands out what is buffered, or
    waits up to the fetch timeout for the next message. A trickle thus costs one pull request per batch_size
    messages or per expiry, not one or two per message (which had a nodemetric service at 100 messages/s spend
    more than half its CPU on pulls). Messages still buffered when the source closes are nak'ed, so the server
    redelivers them at once.

    A consumer read in stream order (ConsumerSpec.retry_flush_in_place: its store skips what is at or below its
    offset) checks the consumer's delivery sequence: a gap means deliveries were lost in flight (the server that
    sent them, or the connection, went down with them), which the server would redeliver only after ack_wait, after
    newer ones the store would already have passed. The batch is cut before the gap, the buffer dropped, and the
    consumer made again from the message after the last one handed out.
    """

    def __init__(
        self,
        nc: Client,
        js: JetStreamContext,
        spec: ConsumerSpec,
        *,
        reset: bool,
        config: Callable[[], js_api.ConsumerConfig] | None = None,
        confirm_acks: Callable[[], bool] = lambda: False,
    ) -> None:
        self._nc = nc
        self._js = js
        self._spec = spec
        self._confirm_acks = confirm_acks
        """Whether acks ask the server to confirm them (on a cluster; see `ack`)."""
        self._unconfirmed: dict[str, tuple[Msg, float, float]] = {}
        """Ack token → (message, monotonic times its ack was first and last sent) until the server confirms it."""
        self._ack_prefix: str | None = None
        self._ack_sub: Any = None
        self._ack_tokens = itertools.count()
        self.stats: ConsumerStats | None = None
        self._reset = reset
        self._config = config or (lambda: consumer_config(spec))
        """The consumer to create when it is missing (at the first fetch, or after the server lost it)."""
        self._lost = False
        self._bind_lock = asyncio.Lock()
        self._inbox: str | None = None
        self._sub: Any = None
        self._buffer: collections.deque[Msg] = collections.deque()
        self._arrived = asyncio.Event()
        """Set by the callback when a message arrives or a request ends."""
        self._request_remaining = 0
        """Messages the open pull requests may still deliver; 0: none open."""
        self._request_until = 0.0
        """Monotonic time after which the newest request is over even if its ending status never arrived."""
        self._request_subject = f"$JS.API.CONSUMER.MSG.NEXT.{spec.stream}.{spec.durable}"
        self._in_order = spec.retry_flush_in_place
        self._last_delivery: int | None = None
        """The consumer's delivery sequence of the last message received (0: none yet from a consumer this source
        made; None: unknown, a consumer that was already there when this source first bound it). Kept when the
        source binds the same consumer again."""
        self._handed_out: int | None = None
        """The highest stream sequence handed out since this source started."""
        self._restart = False
        """A gap was seen: make the consumer again after `_handed_out` at the next fetch."""

    async def _bind(self) -> str:
        # One bind at a time: the loop's first fetch and a wait_idle() may both get here first, and a second
        # reset interleaved with the first (delete, create, delete) would drop the durable the loop pulls from
        # and let wait_idle() read a consumer that is not the one being replayed.
        async with self._bind_lock:
            if self._inbox is not None:
                return self._inbox
            spec = self._spec
            if self._reset:
                with contextlib.suppress(nats.js.errors.NotFoundError):
                    await self._js.delete_consumer(spec.stream, spec.durable)
                self._reset = False
            try:
                await self._js.consumer_info(spec.stream, spec.durable)
                # The durable goes on numbering its deliveries across a rebind (its leader lost, a 503 for a pull):
                # what this source last received stays the mark, so deliveries lost in flight with the old leader
                # are a gap at the next message. Unknown (None) only when the consumer was there before this source.
            except nats.js.errors.NotFoundError:
                await self._js.add_consumer(spec.stream, config=self._config())
                self._last_delivery = 0
            inbox = self._nc.new_inbox()
            self._sub = await self._nc.subscribe(inbox, cb=self._on_message)
            self._inbox = inbox
            return inbox

    async def _on_message(self, msg: Msg) -> None:
        headers = msg.headers or {}
        if status := headers.get("Status"):  # 408 request expired, 409 …: the request is over
            self._request_remaining = 0
            # No consumer answers the subject any more (503), or the server says it deleted it: bind again.
            self._lost |= status == "503" or "Consumer Deleted" in headers.get("Description", "")
            self._arrived.set()
            return
        self._buffer.append(msg)
        self._request_remaining -= 1
        self._arrived.set()

    async def ack(self, msg: Msg) -> None:
        """Ack `msg`. On a cluster the ack asks for the server's confirmation (an empty reply): an ack sent while
        the consumer's leader is lost or being elected goes nowhere, and the new leader would redeliver the message
        only after ack_wait (30 s: the whole consumer stalled that long behind it). Unconfirmed acks are sent again
        (acking twice is harmless) at each fetch once ACK_CONFIRM_SECONDS old, until the server confirms them or
        ack_wait has passed (the message comes back anyway, and the handler has seen it)."""
        if not self._confirm_acks():
            await msg.ack()
            return
        now = time.monotonic()
        await self._send_ack(msg, first_sent=now, now=now)

    async def _send_ack(self, msg: Msg, *, first_sent: float, now: float) -> None:
        if self._ack_prefix is None:
            prefix = self._nc.new_inbox()
            self._ack_sub = await self._nc.subscribe(f"{prefix}.*", cb=self._on_ack_confirmed)
            self._ack_prefix = prefix
        token = str(next(self._ack_tokens))
        self._unconfirmed[token] = (msg, first_sent, now)
        await self._nc.publish(msg.reply, b"+ACK", reply=f"{self._ack_prefix}.{token}")

    async def _on_ack_confirmed(self, msg: Msg) -> None:
        if (msg.headers or {}).get("Status") == NO_RESPONDERS_STATUS:
            return  # no consumer leader took it: it stays unconfirmed, to be sent again
        self._unconfirmed.pop(msg.subject.rpartition(".")[2], None)

    async def _resend_unconfirmed_acks(self) -> None:
        now = time.monotonic()
        due = [(t, m, first) for t, (m, first, last) in self._unconfirmed.items() if now - last >= ACK_CONFIRM_SECONDS]
        for token, msg, first_sent in due:
            del self._unconfirmed[token]
            if now - first_sent < self._spec.ack_wait_seconds:
                await self._send_ack(msg, first_sent=first_sent, now=now)
                if self.stats is not None:
                    self.stats.acks_resent += 1

    async def fetch(self) -> list[Fetched]:
        if self._unconfirmed:
            await self._resend_unconfirmed_acks()
        if self._lost and not self._buffer:
            log.info("consumer %s on %s: the server lost it; binding again", self._spec.durable, self._spec.stream)
            await self._unbind()
            self._lost = False
        if self._restart:
            await self._restart_after_handed_out()
        inbox = await self._bind()
        if self._request_remaining <= 0 or time.monotonic() >= self._request_until:
            self._request_remaining = 0
            await self._request(inbox)
        elif self._request_remaining < self._spec.batch_size // 2:  # a busy stream: ask ahead, no gap between
            await self._request(inbox)
        if not self._buffer:
            self._arrived.clear()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._spec.fetch_timeout_seconds):
                    await self._arrived.wait()
        batch = [self._buffer.popleft() for _ in range(min(len(self._buffer), self._spec.batch_size))]
        if self._in_order:
            batch = self._before_any_gap(batch)
        # Acks and naks are plain publishes; flushing after the batch is not needed for correctness.
        return [Fetched(_delivery(m), _MsgAcker(m, self)) for m in batch]

    def _before_any_gap(self, batch: list[Msg]) -> list[Msg]:
        """`batch` up to a gap in the consumer's delivery sequence; at a gap, the buffer is dropped and the
        consumer is to be made again (see the class docstring)."""
        for index, msg in enumerate(batch):
            sequence = msg.metadata.sequence
            if self._last_delivery is not None and sequence.consumer > self._last_delivery + 1:
                lost = sequence.consumer - self._last_delivery - 1
                log.warning(
                    "consumer %s on %s: %d deliveries lost in flight before stream sequence %d; making it again "
                    "after stream sequence %s, so that nothing is handed out of order",
                    self._spec.durable,
                    self._spec.stream,
                    lost,
                    sequence.stream,
                    self._handed_out,
                )
                if self.stats is not None:
                    self.stats.deliveries_lost += lost
                self._buffer.clear()
                self._request_remaining = 0
                self._restart = True
                return batch[:index]
            self._last_delivery = sequence.consumer
            self._handed_out = max(self._handed_out or 0, sequence.stream)
        return batch

    async def _restart_after_handed_out(self) -> None:
        """Drop the pull subscription and make the consumer again, from the message after the last one handed out
        (from its configured start when none was)."""
        await self._unbind()
        if self._handed_out is not None:
            restart = replace(self._spec, deliver_policy="by_start_sequence", opt_start_seq=self._handed_out + 1)
            self._config = lambda: consumer_config(restart)
        self._reset = True
        self._restart = False

    async def _request(self, inbox: str) -> None:
        """Ask for another batch, expiring before the fetch's own wait does."""
        expires_seconds = self._spec.fetch_timeout_seconds * 0.9
        self._request_remaining += self._spec.batch_size
        self._request_until = time.monotonic() + expires_seconds + 0.5  # its 408 is late or lost: ask again anyway
        request = {"batch": self._spec.batch_size, "expires": int(expires_seconds * 1e9)}
        await self._nc.publish(self._request_subject, json.dumps(request).encode(), reply=inbox)

    @property
    def buffered(self) -> int:
        """Messages received and not yet handed out."""
        return len(self._buffer)

    async def outstanding(self) -> int:
        await self._bind()
        info = await self._js.consumer_info(self._spec.stream, self._spec.durable)
        return (info.num_pending or 0) + (info.num_ack_pending or 0)

    async def close(self) -> None:
        # What arrived and was never handed out goes back now (a nak), not after ack_wait: another consumer of the
        # durable, or this one started again, gets it at once (under load a fetch hands over part of what came).
        buffered = list(self._buffer)
        self._buffer.clear()
        if buffered and self._nc.is_connected:
            with contextlib.suppress(*_UNAVAILABLE, nats.errors.Error):
                for msg in buffered:
                    await msg.nak()
        ack_sub, self._ack_sub, self._ack_prefix = self._ack_sub, None, None
        self._unconfirmed.clear()
        if ack_sub is not None and not self._nc.is_closed:
            with contextlib.suppress(*_UNAVAILABLE, nats.errors.BadSubscriptionError):
                await ack_sub.unsubscribe()
        await self._unbind()

    async def _unbind(self) -> None:
        """Drop the pull subscription and what it buffered (acks still unconfirmed are kept: see `ack`)."""
        sub, self._sub, self._inbox = self._sub, None, None
        self._buffer.clear()
        self._request_remaining = 0
        if sub is None or self._nc.is_closed:
            return
        with contextlib.suppress(*_UNAVAILABLE, nats.errors.BadSubscriptionError):
            await sub.unsubscribe()
        # Make sure the batch's acks have left this process before the caller moves on (not while the server is
        # away: the flush would wait its whole timeout for an answer, the acks going out on reconnection anyway).
        if self._nc.is_connected:
            with contextlib.suppress(*_UNAVAILABLE):
                await self._nc.flush(timeout=2)


class _Follower:
    """An ephemeral consumer (no acks, in memory, deleted by the server when unused) read with _PullSource's pull
    requests; made again from the next sequence if the server loses it."""

    def __init__(
        self,
        nc: Client,
        js: JetStreamContext,
        stream: str,
        filters: tuple[str, ...],
        *,
        first_seq: int | None,
        first_time: float | None,
        batch_size: int,
        wait_seconds: float,
    ) -> None:
        self._next_seq = first_seq
        self._first_time = first_time
        self._filters = filters
        self._nc = nc
        self._stream = stream
        self._name = name = f"follow-{secrets.token_hex(8)}"
        self._js = js
        spec = ConsumerSpec(
            durable=name,
            stream=stream,
            filter_subjects=filters,
            service="",
            batch_size=batch_size,
            fetch_timeout_seconds=wait_seconds,
        )
        self._source = _PullSource(nc, js, spec, reset=False, config=lambda: self._consumer_config(name))

    def _consumer_config(self, name: str) -> js_api.ConsumerConfig:
        if self._next_seq is not None:
            policy, start_seq, start = js_api.DeliverPolicy.BY_START_SEQUENCE, max(1, self._next_seq), None
        else:
            policy, start_seq, start = js_api.DeliverPolicy.BY_START_TIME, None, start_time(self._first_time or 0.0)
        filters = list(self._filters)
        return js_api.ConsumerConfig(
            name=name,
            deliver_policy=policy,
            opt_start_seq=start_seq,
            opt_start_time=start,
            ack_policy=js_api.AckPolicy.NONE,
            filter_subject=filters[0] if len(filters) == 1 else None,
            filter_subjects=filters if len(filters) > 1 else None,
            inactive_threshold=FOLLOW_INACTIVE_SECONDS,
            mem_storage=True,
            num_replicas=1,
        )

    async def next(self) -> list[Delivery]:
        try:
            fetched = await self._source.fetch()
        except nats.js.errors.NotFoundError as e:
            raise BusError(f"stream {self._stream} not found") from e
        except _UNAVAILABLE as e:
            raise BusUnavailableError(f"follow {self._stream}: {e}") from e
        deliveries = [f.delivery for f in fetched]
        if deliveries:
            self._next_seq = deliveries[-1].stream_seq + 1
        return deliveries

    async def caught_up(self) -> bool:
        try:
            return await self._source.outstanding() == 0 and not self._source.buffered
        except _UNAVAILABLE as e:
            raise BusUnavailableError(f"follow {self._stream}: {e}") from e

    async def close(self) -> None:
        await self._source.close()
        if not self._nc.is_connected:  # deleted by the server once unused
            return
        with contextlib.suppress(*_UNAVAILABLE, nats.js.errors.NotFoundError, nats.js.errors.APIError, TimeoutError):
            async with asyncio.timeout(FOLLOW_DELETE_SECONDS):
                await self._js.delete_consumer(self._stream, self._name)


def _delivery(msg: Msg) -> Delivery:
    meta = msg.metadata
    return Delivery(
        subject=msg.subject,
        data=bytes(msg.data),
        headers=dict(msg.headers or {}),
        stream_seq=meta.sequence.stream,
        num_delivered=meta.num_delivered,
        published_at=_timestamp(meta.timestamp),
        pending=meta.num_pending if meta.num_pending is not None else -1,
    )


def _implements_bus(bus: JetStreamBus) -> Bus:
    """Never called: mypy proves here that JetStreamBus satisfies the Bus protocol."""
    return bus
