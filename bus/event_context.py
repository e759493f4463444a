"""Which event is being handled right now, for log lines: a context variable the consumer loop sets around each call.

`bus._loop.LoopConsumer` enters a `HandlingEvent` (msg id, subject, stream sequence, consumer) before it calls a
handler and leaves it after the message is settled, so anything logged meanwhile — by the handler, a store, the
loop's own error report — can name the event. `EventContextFilter`, installed on the log handlers by
`koordbus.runtime.configure_logging`, copies the fields onto each `logging.LogRecord` (`event_id`, `subject`,
`stream_seq`, `consumer`, `node`); a record logged outside handling gets none of them. The node comes from the
subject when it names one (`koord.v1.node.<n>.…`, `….k8s.node.<n>`, the NodeSLO key of `<n>` …); a handler that
learns it otherwise (a pod's node) may call `bind_node`. Standard library only: the agent imports it too.
"""

from __future__ import annotations

import contextvars
import logging

from bus import subjects

EVENT_FIELDS = ("event_id", "subject", "stream_seq", "consumer", "node")
"""The LogRecord attributes EventContextFilter sets while an event is handled, in the order a formatter shows them."""

_UNSET = object()


class HandlingEvent:
    """The event a consumer is handling; `node` is derived from the subject on first use (most lines never ask)."""

    __slots__ = ("_node", "consumer", "event_id", "stream_seq", "subject")

    def __init__(self, *, event_id: str, subject: str, stream_seq: int, consumer: str) -> None:
        self.event_id = event_id
        self.subject = subject
        self.stream_seq = stream_seq
        self.consumer = consumer
        self._node: object = _UNSET

    @property
    def node(self) -> str | None:
        if self._node is _UNSET:
            self._node = node_in_subject(self.subject)
        return self._node  # type: ignore[return-value]

    @node.setter
    def node(self, value: str | None) -> None:
        self._node = value


_CURRENT: contextvars.ContextVar[HandlingEvent | None] = contextvars.ContextVar("koordbus_event", default=None)


def enter(event: HandlingEvent) -> contextvars.Token[HandlingEvent | None]:
    """Mark `event` as being handled in this context; pass the token to `leave`."""
    return _CURRENT.set(event)


def leave(token: contextvars.Token[HandlingEvent | None]) -> None:
    _CURRENT.reset(token)


def current() -> HandlingEvent | None:
    """The event being handled in this context, or None outside handling."""
    return _CURRENT.get()


def bind_node(node: str) -> None:
    """Name the node the current event concerns when its subject does not (no effect outside handling)."""
    event = _CURRENT.get()
    if event is not None:
        event.node = node


_NODE_SLO_PREFIX = f"$KV.{subjects.SLO_BUCKET}."


def node_in_subject(subject: str) -> str | None:
    """The node a subject is about, or None: `koord.v1.{node,nodemetric,noderesource}.<n>.…`, `koord.v1.k8s.node.<n>`,
    `koord.v1.k8s.nrt.<n>` and the NodeSLO key `$KV.KOORD_SLO.<n>`."""
    try:
        if subject.startswith(_NODE_SLO_PREFIX):
            return subjects.node_of_slo_key(subject)
        parts = subject.split(".")
        if len(parts) < 4 or parts[0] + "." + parts[1] != subjects.PREFIX:
            return None
        if parts[2] in ("node", "nodemetric"):  # as published, or as the stream stores it (with the partition)
            return subjects.node_of(subject)
        if parts[2] == "noderesource" and len(parts) == 5:
            # koord.v1.noderesource.config.status is the one subject of the family that names no node
            return None if parts[4] != "computed" else subjects.decode_token(parts[3])
        if parts[2] == "k8s" and len(parts) == 5 and parts[3] in ("node", "nrt"):
            return subjects.decode_token(parts[4])
    except subjects.SubjectError:
        return None
    return None


class EventContextFilter(logging.Filter):
    """Adds the handled event's fields to each record (never drops one); outside handling it sets them to None."""

    def filter(self, record: logging.LogRecord) -> bool:
        event = _CURRENT.get()
        if event is None:
            for name in EVENT_FIELDS:
                if not hasattr(record, name):
                    setattr(record, name, None)
            return True
        record.event_id = event.event_id
        record.subject = event.subject
        record.stream_seq = event.stream_seq
        record.consumer = event.consumer
        record.node = event.node
        return True
