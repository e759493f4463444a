"""The reflector's pure decisions: what a list or a watch event means for the objects known so far.

A reflector (services.k8s.watch) lists a collection, then watches it from the list's resourceVersion. This module
parses the wire format (a list body, one watch line) without touching the objects' content beyond their identity,
and keeps the minimal state per object (key → resourceVersion, uid, nodeName) needed to skip repeats and to write
tombstones for objects that vanished between two lists. Every decision is returned as `Change` values; the
observer (services.k8s.observer) decodes them into schemas.kube and publishes. No I/O, clock or event loop here.
"""

from __future__ import annotations

import json
from typing import Final

import msgspec

ADDED: Final = "ADDED"
MODIFIED: Final = "MODIFIED"
DELETED: Final = "DELETED"
BOOKMARK: Final = "BOOKMARK"
ERROR: Final = "ERROR"

HTTP_GONE: Final = 410
"""The resourceVersion a watch resumes from left the server's history: list again."""

ObjectKey = tuple[str, str]
"""(namespace, name); namespace is "" for cluster-scoped objects."""


class MalformedError(ValueError):
    """A list body, watch line or object that cannot be understood; the message says why."""


# --- the wire format, read leniently: only identity fields are looked at here


class _HeadMeta(msgspec.Struct, frozen=True, rename="camel"):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    resource_version: str = ""


class _HeadSpec(msgspec.Struct, frozen=True, rename="camel"):
    node_name: str | None = None


class _Head(msgspec.Struct, frozen=True):
    metadata: _HeadMeta = _HeadMeta()
    spec: _HeadSpec = _HeadSpec()


class _ListMeta(msgspec.Struct, frozen=True, rename="camel"):
    resource_version: str = ""


class _ListBody(msgspec.Struct, frozen=True):
    metadata: _ListMeta = _ListMeta()
    items: list[msgspec.Raw] | None = None


class _WatchLine(msgspec.Struct, frozen=True):
    type: str
    object: msgspec.Raw


class _Status(msgspec.Struct, frozen=True):
    code: int = 0
    reason: str = ""
    message: str = ""


_HEAD_DECODER: Final = msgspec.json.Decoder(_Head)
_LIST_DECODER: Final = msgspec.json.Decoder(_ListBody)
_LINE_DECODER: Final = msgspec.json.Decoder(_WatchLine)
_STATUS_DECODER: Final = msgspec.json.Decoder(_Status)


class Seen(msgspec.Struct, frozen=True, gc=False):
    """What is kept per known object: enough to skip a repeat and to write its tombstone later."""

    resource_version: str
    uid: str = ""
    node_name: str = ""
    """spec.nodeName of a pod ("" for other kinds): a pod's tombstone names the node it leaves."""


class ObjectIdentity(msgspec.Struct, frozen=True, gc=False):
    key: ObjectKey
    seen: Seen


class Change(msgspec.Struct, frozen=True, kw_only=True):
    """One object's new state, or its tombstone (`deleted`), to be published."""

    key: ObjectKey
    seen: Seen
    """The object's identity at this change; for a tombstone, as last seen (resourceVersion: the deletion's)."""
    deleted: bool = False
    raw: bytes | None = None
    """The object's JSON; None for the tombstone of an object that vanished between two lists."""


class ListResult(msgspec.Struct, frozen=True):
    resource_version: str
    items: list[bytes]


class WatchEvent(msgspec.Struct, frozen=True):
    """One watch line: ADDED/MODIFIED/DELETED with the object, BOOKMARK with a resourceVersion, or ERROR."""

    type: str
    raw: bytes
    error_code: int = 0
    error_message: str = ""


def parse_list(body: bytes) -> ListResult:
    """The resourceVersion and raw items of a list response."""
    try:
        parsed = _LIST_DECODER.decode(body)
    except msgspec.DecodeError as err:
        raise MalformedError(f"list response: {err}") from None
    if not parsed.metadata.resource_version:
        raise MalformedError("list response has no metadata.resourceVersion")
    return ListResult(parsed.metadata.resource_version, [bytes(item) for item in parsed.items or ()])


def parse_watch_line(line: bytes) -> WatchEvent:
    """One line of a watch stream; an ERROR carries the Status code (410 for an expired resourceVersion)."""
    try:
        parsed = _LINE_DECODER.decode(line)
    except msgspec.DecodeError as err:
        raise MalformedError(f"watch event: {err}") from None
    raw = bytes(parsed.object)
    if parsed.type != ERROR:
        return WatchEvent(parsed.type, raw)
    try:
        status = _STATUS_DECODER.decode(raw)
    except msgspec.DecodeError as err:
        raise MalformedError(f"watch ERROR event without a Status: {err}") from None
    return WatchEvent(ERROR, raw, error_code=status.code, error_message=status.message or status.reason)


def json_object(body: bytes) -> dict[str, object]:
    """A response body that must be one JSON object; ValueError saying what it is instead."""
    try:
        document = json.loads(body)
    except ValueError as err:
        raise ValueError(f"the answer is not JSON ({err})") from None
    if not isinstance(document, dict):
        raise ValueError("the answer is not a JSON object")
    return document


def error_status(body: bytes) -> str:
    """The message of a Status error body, or the body itself (shortened) when it is not one."""
    try:
        status = _STATUS_DECODER.decode(body)
    except msgspec.DecodeError:
        return body[:200].decode(errors="replace")
    return status.message or status.reason or body[:200].decode(errors="replace")


def identity(raw: bytes, *, namespaced: bool) -> ObjectIdentity:
    """The key and Seen of an object; MalformedError when it has no name or resourceVersion."""
    try:
        head = _HEAD_DECODER.decode(raw)
    except msgspec.DecodeError as err:
        raise MalformedError(f"object metadata: {err}") from None
    meta = head.metadata
    if not meta.name:
        raise MalformedError("object without metadata.name")
    if not meta.resource_version:
        raise MalformedError(f"object {meta.name!r} without metadata.resourceVersion")
    if namespaced and not meta.namespace:
        raise MalformedError(f"object {meta.name!r} without metadata.namespace")
    namespace = meta.namespace if namespaced else ""
    return ObjectIdentity((namespace, meta.name), Seen(meta.resource_version, meta.uid, head.spec.node_name or ""))


def bookmark_version(raw: bytes) -> str:
    """The resourceVersion a BOOKMARK event carries."""
    try:
        version = _HEAD_DECODER.decode(raw).metadata.resource_version
    except msgspec.DecodeError as err:
        raise MalformedError(f"BOOKMARK object: {err}") from None
    if not version:
        raise MalformedError("BOOKMARK without metadata.resourceVersion")
    return version


BACKOFF_JITTER: Final = 0.2
"""A retry delay is shortened by up to this share of itself, at random (see backoff_delay)."""


def backoff_delay(failures: int, *, initial: float, maximum: float, jitter: float = 0.0) -> float:
    """Delay before the next attempt after `failures` consecutive failures (0 when there were none): doubling from
    `initial` up to `maximum`. `jitter` (0 … 1, a random draw the caller makes) shortens it by up to BACKOFF_JITTER
    of itself, so objects (and replicas) that failed together do not all retry in the same instant."""
    if failures <= 0:
        return 0.0
    capped = min(maximum, initial * 2.0 ** min(failures - 1, 32))
    return float(capped * (1.0 - BACKOFF_JITTER * min(max(jitter, 0.0), 1.0)))


class ReflectorState:
    """The objects of one collection as last listed or watched, and the resourceVersion to resume from.

    `resource_version` is "" until the first list, and again after a 410 (`expire`): the next step is a relist.
    """

    def __init__(self, *, namespaced: bool) -> None:
        self.namespaced = namespaced
        self.known: dict[ObjectKey, Seen] = {}
        self.resource_version = ""

    def relist(self, result: ListResult) -> tuple[list[Change], list[str]]:
        """Changes for a fresh list: objects new or changed since last seen, and tombstones (at the list's
        resourceVersion) for known objects the list no longer holds. Also the reasons of skipped items."""
        changes: list[Change] = []
        rejected: list[str] = []
        listed: dict[ObjectKey, Seen] = {}
        for raw in result.items:
            try:
                found = identity(raw, namespaced=self.namespaced)
            except MalformedError as err:
                rejected.append(str(err))
                continue
            listed[found.key] = found.seen
            if self.known.get(found.key) != found.seen:
                changes.append(Change(key=found.key, seen=found.seen, raw=raw))
        for key, seen in self.known.items():
            if key not in listed:
                tombstone = Seen(result.resource_version, seen.uid, seen.node_name)
                changes.append(Change(key=key, seen=tombstone, deleted=True))
        self.known = listed
        self.resource_version = result.resource_version
        return changes, rejected

    def apply(self, event: WatchEvent) -> Change | None:
        """The change one ADDED/MODIFIED/DELETED/BOOKMARK event makes (None: nothing to publish).

        A repeat of the state already known is skipped; the resume point moves to the event's resourceVersion.
        ERROR events are the caller's (see `expire`); unknown types are MalformedError.
        """
        if event.type == BOOKMARK:
            self.resource_version = bookmark_version(event.raw)
            return None
        if event.type not in (ADDED, MODIFIED, DELETED):
            raise MalformedError(f"unexpected watch event type {event.type!r}")
        found = identity(event.raw, namespaced=self.namespaced)
        self.resource_version = found.seen.resource_version
        if event.type == DELETED:
            previous = self.known.pop(found.key, None)
            seen = found.seen
            if previous is not None and not seen.node_name:
                seen = Seen(seen.resource_version, seen.uid or previous.uid, previous.node_name)
            return Change(key=found.key, seen=seen, deleted=True, raw=event.raw)
        if self.known.get(found.key) == found.seen:
            return None
        self.known[found.key] = found.seen
        return Change(key=found.key, seen=found.seen, raw=event.raw)

    def expire(self) -> None:
        """The resume point is gone (410): the next step is a relist, which diffs against `known`."""
        self.resource_version = ""
