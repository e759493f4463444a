"""The bus interface: stream and consumer specs, deliveries, and the Bus protocol both buses implement.

Services depend on this module only; `koordbus` (the composition root) picks the
implementation. Keep it small: every method here must be implemented twice and pass the
contract suite on both buses.
"""

from __future__ import annotations

import bisect
import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

DeliverPolicy = Literal["all", "new", "by_start_time", "by_start_sequence", "last_per_subject"]

HEADER_MSG_ID = "Nats-Msg-Id"
HEADER_DLQ_REASON = "Koord-Dlq-Reason"
HEADER_DLQ_SUBJECT = "Koord-Dlq-Subject"
HEADER_DLQ_STREAM_SEQ = "Koord-Dlq-Stream-Seq"
HEADER_DLQ_CONSUMER = "Koord-Dlq-Consumer"
HEADER_RPC_ERROR = "Koord-Rpc-Error"
"""Set on a reply when the responder's handler raised: the request raises RemoteError with this text (or
BusUnavailableError when the text starts with UNAVAILABLE_PREFIX)."""
UNAVAILABLE_PREFIX = "BusUnavailableError: "
"""The handler failed because the bus did not answer it (a publish without an ack in time): the asker hears it as
the bus being unavailable (a 503 at the API, worth trying again), not as the responder failing."""


@dataclass(frozen=True, kw_only=True)
class StreamSpec:
    """A stream and its limits. `duplicate_window_seconds` must exceed ack_wait × max_deliver of its consumers."""

    name: str
    subjects: tuple[str, ...]
    max_age_seconds: float
    duplicate_window_seconds: float = 300.0
    max_bytes: int | None = -1
    """-1: no cap; None: the server's — created without a cap, an existing stream's cap kept (bus.streams.SizeCaps)."""
    max_msgs_per_subject: int = -1
    replicas: int = 1
    storage: Literal["file", "memory"] = "file"
    allow_direct: bool = False
    """Serve direct gets (`$JS.API.DIRECT.GET.<stream>.<subject>`): reads of one subject that NATS permissions can
    grant subject by subject (an agent reads only its own NodeSLO key)."""
    subject_transform: tuple[str, str] | None = None
    """(source, destination): how the stream rewrites a matching subject as it stores it (bus.subject_transform),
    e.g. appending a node's partition so replicas can each consume a share of the nodes."""


@dataclass(frozen=True, kw_only=True)
class ConsumerSpec:
    """A durable pull consumer: one per service and purpose."""

    durable: str
    stream: str
    filter_subjects: tuple[str, ...]
    service: str
    """Names the dead-letter subject `koord.v1.dlq.<service>`."""
    ack_wait_seconds: float = 30.0
    max_deliver: int = 5
    max_ack_pending: int = 20_000
    batch_size: int = 256
    fetch_timeout_seconds: float = 1.0
    linger_seconds: float = 0.0
    """After a batch smaller than batch_size, wait this long before fetching again, so that a steady trickle is
    handled (and flushed: one database transaction per batch in a projector) in fewer, larger batches. 0: fetch at
    once. Adds up to this much latency."""
    deliver_policy: DeliverPolicy = "all"
    opt_start_time: float | None = None
    """Unix seconds; only with deliver_policy="by_start_time"."""
    opt_start_seq: int | None = None
    """First stream sequence; only with deliver_policy="by_start_sequence" (a projection resuming from its offset)."""
    retry_flush_in_place: bool = False
    """A failed flush is retried with the same batch (capped exponential backoff with jitter) until it succeeds or
    the consumer stops, and nothing newer is fetched meanwhile; the batch stays unacknowledged. For projections
    whose store skips sequences at or below its offset: a nak'ed batch comes back after newer messages, and once
    those are written the store would skip it for good. Off: the batch is nak'ed and redelivered (any order).
    On, the messages are also handed out in stream order when deliveries are lost in flight (a server or
    connection lost with a pull's messages on their way: the server redelivers them only after ack_wait, after
    newer ones): the consumer is restarted after the last message handed out (ConsumerStats.deliveries_lost)."""
    inactive_threshold_seconds: float | None = None
    """The server deletes the durable after this long without a consumer: for durables named after a replica's
    instance (a Deployment's pod names change with every pod, so old ones would otherwise stay for ever). None:
    kept until deleted."""


@dataclass(frozen=True, kw_only=True)
class Delivery:
    """One message as a handler sees it."""

    subject: str
    data: bytes
    headers: Mapping[str, str]
    stream_seq: int
    num_delivered: int
    published_at: float
    """Server time the message was stored, unix seconds."""
    pending: int = -1
    """How many messages after this one the consumer had still to be delivered when this one was sent (the
    server's count: the consumer's lag); -1 when the bus does not know."""

    @property
    def msg_id(self) -> str:
        return self.headers.get(HEADER_MSG_ID, "")


@dataclass(frozen=True, kw_only=True)
class PublishAck:
    stream: str
    seq: int
    duplicate: bool = False


HANDLE_SECONDS_BUCKETS: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
)  # fmt: skip
"""Upper bounds (seconds) of the delivery-to-ack buckets: a batch is flushed in milliseconds, or held up for
seconds by a slow database or Kubernetes API."""
EVENT_AGE_SECONDS_BUCKETS: tuple[float, ...] = (
    0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 1800.0, 3600.0,
)  # fmt: skip
"""Upper bounds (seconds) of the event-age buckets: a live event is handled within a second of its publication; a
replay at start-up or a backlog after an outage handles events minutes or hours old."""


@dataclass(kw_only=True)
class Distribution:
    """Observations counted into fixed buckets: the data of a Prometheus histogram, kept without the dependency."""

    bounds: tuple[float, ...]
    """Increasing upper bounds; a value lands in the first bucket whose bound is ≥ it, or in the overflow."""
    counts: list[int] = field(default_factory=list)
    """Per bucket, not cumulative: len(bounds) + 1 entries, the last for values above every bound."""
    total: float = 0.0
    """Sum of the observed values."""

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def plus(self, other: Distribution) -> Distribution:
        """Both distributions' observations together (same bounds)."""
        if other.bounds != self.bounds:
            raise ValueError(f"cannot add distributions with different buckets: {self.bounds} and {other.bounds}")
        counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]
        return Distribution(bounds=self.bounds, counts=counts, total=self.total + other.total)


@dataclass(kw_only=True)
class ConsumerStats:
    """Counters, distributions and the lag a consumer keeps; the service exports them as metrics."""

    delivered: int = 0
    acked: int = 0
    naked: int = 0
    termed: int = 0
    dead_lettered: int = 0
    flush_failures: int = 0
    fetch_errors: int = 0
    acks_resent: int = 0
    """Acks sent again because the server did not confirm them (on a cluster: lost with a consumer leader)."""
    deliveries_lost: int = 0
    """Deliveries lost in flight on a consumer read in stream order (ConsumerSpec.retry_flush_in_place), seen as a
    gap in the consumer's sequence; the consumer was restarted after the last message handed out."""
    last_error: str = ""
    pending: int = 0
    """The lag: messages after the last one delivered that the consumer has yet to receive (that delivery's
    `Delivery.pending`; 0 before the first)."""
    handle_seconds: Distribution = field(default_factory=lambda: Distribution(bounds=HANDLE_SECONDS_BUCKETS))
    """Seconds from a message's delivery (its batch fetched) to its ack: handling, the batch's flush and the ack."""
    event_age_seconds: Distribution = field(default_factory=lambda: Distribution(bounds=EVENT_AGE_SECONDS_BUCKETS))
    """Age of each delivered message when its handler is called: now − the time the stream stored it."""


class Handler(Protocol):
    """What a consumer loop drives.

    `handle` is called per message in stream order; raise TemporaryError to nak it,
    PermanentError (or let a msgspec decode/validation error escape) to term + dead-letter
    it. `flush` is called once per fetched batch, before any ack of that batch is sent, so a
    handler can commit a whole batch in one transaction; if it raises, the batch's successful
    messages are nak'ed instead of acked.
    """

    async def handle(self, delivery: Delivery) -> None: ...

    async def flush(self) -> None: ...


class Consumer(Protocol):
    """A running consumer loop."""

    @property
    def stats(self) -> ConsumerStats: ...

    async def stop(self) -> None:
        """Finish the batch in hand, ack it, and stop fetching."""
        ...

    async def wait_idle(self, timeout: float) -> bool:
        """True once the consumer has no pending messages (all delivered and acked), False on timeout."""
        ...


@dataclass(frozen=True, kw_only=True)
class PublishOptions:
    expected_last_subject_seq: int | None = None
    """Optimistic concurrency: the publish fails with ConflictError unless this is the subject's last sequence."""
    headers: Mapping[str, str] = field(default_factory=dict)


class RequestHandler(Protocol):
    """Answers one request (core NATS request/reply, no stream): the reply's bytes. Raising makes the request
    fail with RemoteError naming the exception (BusUnavailableError when the handler's own use of the bus raised
    it); handlers should answer their own errors in their reply format."""

    async def __call__(self, data: bytes) -> bytes: ...


class Responder(Protocol):
    """A running request handler subscription."""

    async def stop(self) -> None:
        """Stop taking requests (requests already taken are answered)."""
        ...


@dataclass(frozen=True, kw_only=True)
class FollowFrom:
    """Where a follower starts: at a stream sequence, at a time, or (neither) after the stream's last message."""

    sequence: int | None = None
    """The first stream sequence to deliver; one older than the stream retains starts at the oldest retained."""
    time: float | None = None
    """Unix seconds: the first message stored at or after it."""


class Follower(Protocol):
    """Reads a stream in order from a start, with no durable state and no acks: for readers that come and go (an
    API client's subscription, a history page). Survives the server dropping its consumer (it picks up after the
    last message it delivered)."""

    async def next(self) -> list[Delivery]:
        """The next messages in stream order (each with `pending`: matching messages still to come); an empty list
        when none arrived within the follower's wait."""
        ...

    async def caught_up(self) -> bool:
        """Whether every matching message stored so far has been handed out (an empty `next` may only mean a slow
        server)."""
        ...

    async def close(self) -> None: ...


class Bus(Protocol):
    @property
    def connected(self) -> bool:
        """Whether the bus is reachable right now (False while reconnecting or closed): for what a stop would
        otherwise wait on in vain."""
        ...

    async def ensure_streams(self, specs: Iterable[StreamSpec]) -> None:
        """Create missing streams and bring existing ones to the spec; calling it twice changes nothing."""
        ...

    async def publish(
        self, subject: str, data: bytes, *, msg_id: str, options: PublishOptions | None = None
    ) -> PublishAck:
        """Store one message and wait for the stream's ack. In-flight publishes are bounded;
        a publish past the bound waits. A repeated msg_id inside the duplicate window is not
        stored again (ack.duplicate is True). bus.subjects.SubjectError, before anything is sent, for a subject
        longer than bus.subjects.MAX_SUBJECT_BYTES."""
        ...

    async def publish_many(self, messages: Sequence[tuple[str, bytes, str]]) -> list[PublishAck]:
        """Publish (subject, data, msg_id) triples pipelined within the in-flight bound."""
        ...

    async def publish_many_if_last(self, messages: Sequence[tuple[str, bytes, str, int]]) -> list[PublishAck | None]:
        """Publish (subject, data, msg_id, expected last subject sequence) pipelined, each stored only if its
        subject's last sequence is the expected one (0: nothing on it); None for each one refused (what `publish`
        raises ConflictError for), so the rest of the batch stands. Any other failure raises, as publish_many."""
        ...

    def consume(self, spec: ConsumerSpec, handler: Handler, *, reset: bool = False) -> Consumer:
        """Start a durable pull consumer loop (creating the durable if missing). `reset` deletes
        and recreates the durable first, so its deliver policy applies again."""
        ...

    async def last_on_subject(self, stream: str, subject: str, *, direct: bool = False) -> Delivery | None:
        """The newest message stored on exactly this subject, or None; a subject with wildcards finds the newest on
        any subject it matches (a per-node subject's stored form, `subjects.stored`). `direct` reads it with a direct
        get (the stream must allow them), which a NATS permission can grant for this subject alone."""
        ...

    async def stream_info(self, stream: str) -> tuple[int, int]:
        """(message count, last sequence) of a stream."""
        ...

    async def stream_bounds(self, stream: str) -> tuple[int, int]:
        """(first, last) sequence the stream retains; first = last + 1 when it holds nothing."""
        ...

    async def follow(
        self,
        stream: str,
        filter_subjects: Sequence[str],
        start: FollowFrom,
        *,
        batch_size: int = 256,
        wait_seconds: float = 1.0,
    ) -> Follower:
        """Start reading `stream`'s messages on `filter_subjects` from `start`. BusError when the stream does not
        exist."""
        ...

    async def read_recent(self, stream: str, subject: str, *, since: float, limit: int) -> list[Delivery]:
        """The newest `limit` messages on `subject` (wildcards allowed) stored at or after `since` (unix seconds),
        oldest first. A one-off read for queries (no durable state); costs one pass over what matches."""
        ...

    async def serve(self, subject: str, handler: RequestHandler, *, queue: str, concurrency: int = 1) -> Responder:
        """Answer requests on `subject`; responders sharing `queue` split the requests (one answers each). Up to
        `concurrency` requests are answered at once (1: one after the other, in arrival order)."""
        ...

    async def request(self, subject: str, data: bytes, *, timeout: float) -> bytes:
        """Send a request and return the reply's bytes. BusUnavailableError when nobody serves the subject or
        no answer comes within `timeout`, or the responder's handler found the bus unavailable; RemoteError when the
        responder's handler raised anything else."""
        ...

    async def close(self) -> None: ...


def msg_id(*parts: object) -> str:
    """A deterministic Nats-Msg-Id from the parts that identify a message's cause."""
    digest = hashlib.blake2b("\x1f".join(str(p) for p in parts).encode(), digest_size=16)
    return digest.hexdigest()
