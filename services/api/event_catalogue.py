"""What `/api/v1/events` serves: the catalogue of public event types (which stream and subjects each comes from, and
the keys it can be filtered by), subscription filters, resume cursors and the JSON envelope. Pure: no I/O.

An event is one message of one of our streams, classified by its subject. Its envelope:

    {"id": <cursor>, "type": "noderesource.computed", "time": <unix seconds the stream stored it>,
     "stream": "KOORD_NODERESOURCE", "seq": <stream sequence>, "node": "n1", "quota": null, "tree": null,
     "namespace": null, "workload": null, "data": <the message's own JSON, as its service published it>}

A key is null in the envelope unless the event has exactly one value for it (a migration round can decide jobs on
several nodes: it matches a `node` filter naming any of them).

A cursor is a subscription's position in every stream it reads — `1-m120-q7-r4411` (format version, then a
stream code and the last sequence delivered per stream, codes in order) — so a client resuming with the id of the
last event it saw misses nothing and sees nothing twice, across streams. Order is kept within a stream, not
across streams.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

import msgspec

from bus import streams, subjects
from bus.memory import subject_matches
from schemas import names

KEYS: Final = ("node", "quota", "tree", "namespace", "workload")
"""The filters a subscription may give; each event type says which of them it carries."""
KEY_NAMES: Final[Mapping[str, Callable[[str, str], str]]] = {
    "node": names.node_name,
    "quota": names.object_name,
    "tree": names.tree_id,
    "namespace": names.namespace,
    "workload": names.uid,
}
"""The name rule of each filter's value (a value may become a subject: `by_key`)."""

Keys = Mapping[str, tuple[str, ...]]
"""key → the event's values for it (absent: none)."""


class FilterError(ValueError):
    """A subscription's types, filters or cursor are not valid; the message says which and why."""


# --- key extraction: from the subject where it names the key, else from a partial decode of the message


def _token(subject: str, index: int) -> str:
    return subjects.decode_token(subject.split(".")[index])


def _node_from_subject(subject: str, data: bytes) -> Keys:
    return {"node": (subjects.node_of(subject),)}


def _noderesource_node(subject: str, data: bytes) -> Keys:
    return {"node": (_token(subject, 3),)}  # koord.v1.noderesource.<node>.computed


class _QuotaMeta(msgspec.Struct):
    name: str = ""
    namespace: str = ""


class _QuotaObject(msgspec.Struct):
    metadata: _QuotaMeta = msgspec.field(default_factory=_QuotaMeta)


class _QuotaEventKeys(msgspec.Struct):
    quota: _QuotaObject | None = None
    quotas: list[_QuotaObject] = []


_QUOTA_EVENT: Final = msgspec.json.Decoder(_QuotaEventKeys)


def _quota_event(subject: str, data: bytes) -> Keys:
    event = _QUOTA_EVENT.decode(data)
    objects = [event.quota] if event.quota is not None else list(event.quotas)
    return {
        "tree": (subjects.tree_of_quota_events(subject),),
        "quota": _unique(o.metadata.name for o in objects),
        "namespace": _unique(o.metadata.namespace for o in objects),
    }


class _QuotaStatusKeys(msgspec.Struct):
    quota: str = ""
    tree: str = ""
    object: _QuotaObject | None = None


_QUOTA_STATUS: Final = msgspec.json.Decoder(_QuotaStatusKeys)


def _quota_status(subject: str, data: bytes) -> Keys:
    status = _QUOTA_STATUS.decode(data)
    namespace = status.object.metadata.namespace if status.object is not None else ""
    return {"quota": _unique([status.quota]), "tree": _unique([status.tree]), "namespace": _unique([namespace])}


def _quota_tree(subject: str, data: bytes) -> Keys:
    return {"tree": (_token(subject, 4),)}  # koord.v1.quota.trees.<tree>


class _PodRef(msgspec.Struct):
    namespace: str = ""


class _JobSpec(msgspec.Struct, rename="camel"):
    pod_ref: _PodRef | None = None


class _Job(msgspec.Struct):
    spec: _JobSpec = msgspec.field(default_factory=_JobSpec)


class _Decision(msgspec.Struct):
    node: str = ""
    workload: str = ""


class _MigrationKeys(msgspec.Struct):
    job: _Job | str | None = None
    decisions: list[_Decision] = []


_MIGRATION: Final = msgspec.json.Decoder(_MigrationKeys)


def _migration(subject: str, data: bytes) -> Keys:
    event = _MIGRATION.decode(data)
    namespace = ""
    if isinstance(event.job, _Job) and event.job.spec.pod_ref is not None:
        namespace = event.job.spec.pod_ref.namespace
    return {
        "namespace": _unique([namespace]),
        "node": _unique(d.node for d in event.decisions),
        "workload": _unique(d.workload for d in event.decisions),
    }


class _EvictionKeys(msgspec.Struct):
    namespace: str = ""


_EVICTION: Final = msgspec.json.Decoder(_EvictionKeys)


def _eviction(subject: str, data: bytes) -> Keys:
    return {"node": (subjects.node_of(subject),), "namespace": _unique([_EVICTION.decode(data).namespace])}


def _cluster_node(subject: str, data: bytes) -> Keys:
    return {"node": (_token(subject, 4),)}  # koord.v1.k8s.node.<node>


def _no_keys(subject: str, data: bytes) -> Keys:
    return {}


def _unique(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(v for v in values if v))


# --- the catalogue


@dataclass(frozen=True, kw_only=True)
class EventType:
    name: str
    stream: str
    subjects: tuple[str, ...]
    """The stream's subjects this type's messages are stored under (wildcards)."""
    keys: tuple[str, ...]
    description: str
    extract: Callable[[str, bytes], Keys] = field(repr=False)
    by_key: Mapping[str, Callable[[str], str]] = field(default_factory=dict, repr=False)
    """key → the subject filter of this type's events carrying a value for it, where the subject names it: a
    catch-up or history page filtered by that key then reads only its events from the server."""


CATALOGUE: Final[tuple[EventType, ...]] = (
    EventType(
        name="nodemetric.computed",
        stream=streams.KOORD_NODEMETRIC,
        subjects=(subjects.NODEMETRIC_COMPUTED_ALL,),
        keys=("node",),
        description="A node's NodeMetric status was computed (usage, percentiles, pod usages).",
        extract=_node_from_subject,
        by_key={"node": lambda node: subjects.stored(subjects.nodemetric_computed(node))},
    ),
    EventType(
        name="noderesource.computed",
        stream=streams.KOORD_NODERESOURCE,
        subjects=(subjects.NODERESOURCE_COMPUTED_ALL,),
        keys=("node",),
        description="A node's batch/mid allocatable was decided, with the explanation of the figures.",
        extract=_noderesource_node,
        by_key={"node": subjects.noderesource_computed},
    ),
    EventType(
        name="noderesource.config",
        stream=streams.KOORD_NODERESOURCE,
        subjects=(subjects.NODERESOURCE_CONFIG_STATUS,),
        keys=(),
        description="The colocation config was read (accepted, or rejected with the reasons).",
        extract=_no_keys,
    ),
    EventType(
        name="quota.event",
        stream=streams.KOORD_QUOTA,
        subjects=(subjects.QUOTA_EVENTS_ALL,),
        keys=("tree", "quota", "namespace"),
        description="A change to a quota tree: quota or profile created, updated, deleted or imported "
        "(data.type says which).",
        extract=_quota_event,
        by_key={"tree": subjects.quota_events},
    ),
    EventType(
        name="quota.status",
        stream=streams.KOORD_QUOTA_STATUS,
        subjects=(subjects.QUOTA_STATUS_ALL,),
        keys=("quota", "tree", "namespace"),
        description="A quota's computed status changed: min, max, runtime, used, with the explanation.",
        extract=_quota_status,
        by_key={"quota": subjects.quota_status},
    ),
    EventType(
        name="quota.tree",
        stream=streams.KOORD_QUOTA_STATUS,
        subjects=(subjects.QUOTA_TREES_ALL,),
        keys=("tree",),
        description="A quota tree's summary changed: total and problems.",
        extract=_quota_tree,
        by_key={"tree": subjects.quota_tree_status},
    ),
    EventType(
        name="migration.event",
        stream=streams.KOORD_MIGRATION,
        subjects=(subjects.MIGRATION_ALL,),
        keys=("node", "namespace", "workload"),
        description="Pod migration: a job requested, an arbitration round's decisions with reasons, an abort, or a "
        "phase change (data.type says which; workload is the controller's uid).",
        extract=_migration,
    ),
    EventType(
        name="node.actuation",
        stream=streams.KOORD_NODE,
        subjects=(subjects.NODE_ACTUATION_ALL,),
        keys=("node",),
        description="What a node's agent changed (cgroups, resctrl, CPU suppress, burst) and why.",
        extract=_node_from_subject,
        by_key={"node": lambda node: subjects.stored(subjects.node_actuation(node))},
    ),
    EventType(
        name="node.eviction",
        stream=streams.KOORD_NODE,
        subjects=(subjects.NODE_EVICTION_ALL,),
        keys=("node", "namespace"),
        description="A node's agent asked for a pod's eviction, with the feature and reason.",
        extract=_eviction,
        by_key={"node": lambda node: subjects.stored(subjects.node_eviction(node))},
    ),
    EventType(
        name="node.lifecycle",
        stream=streams.KOORD_CLUSTER,
        subjects=(subjects.CLUSTER_NODES,),
        keys=("node",),
        description="A node joined, changed or left the cluster (data.deleted when it left).",
        extract=_cluster_node,
        by_key={"node": subjects.cluster_node},
    ),
    EventType(
        name="colocation.profile",
        stream=streams.KOORD_CCP,
        subjects=(subjects.PROFILES_ALL,),
        keys=(),
        description="A ClusterColocationProfile created, replaced or deleted through the REST API, by whom "
        "(data.type ccp.set.v1 with the whole profile, or ccp.deleted.v1).",
        extract=_no_keys,
    ),
)

BY_NAME: Final = {t.name: t for t in CATALOGUE}

STREAM_CODES: Final = {
    streams.KOORD_NODEMETRIC: "m",
    streams.KOORD_NODERESOURCE: "r",
    streams.KOORD_QUOTA: "q",
    streams.KOORD_QUOTA_STATUS: "s",
    streams.KOORD_MIGRATION: "g",
    streams.KOORD_NODE: "n",
    streams.KOORD_CLUSTER: "c",
    streams.KOORD_CCP: "p",
}
_STREAMS_BY_CODE: Final = {code: stream for stream, code in STREAM_CODES.items()}
CURSOR_VERSION: Final = "1"


def classify(stream: str, subject: str, types: Sequence[EventType]) -> EventType | None:
    """The first of `types` that `subject` of `stream` belongs to."""
    for t in types:
        if t.stream == stream and any(subject_matches(p, subject) for p in t.subjects):
            return t
    return None


# --- subscriptions


@dataclass(frozen=True, kw_only=True)
class EventFilter:
    """Which events a subscription wants: any of `types`, and for each given key, events carrying that value."""

    types: tuple[EventType, ...]
    keys: Mapping[str, str] = field(default_factory=dict)

    @property
    def streams(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(t.stream for t in self.types))

    def subjects_of(self, stream: str) -> tuple[str, ...]:
        """What to read of `stream`: each type's subjects, narrowed to one subject where a key filter names it."""
        found: list[str] = []
        for t in self.types:
            if t.stream != stream:
                continue
            narrowed = [make(self.keys[k]) for k, make in t.by_key.items() if k in self.keys]
            found += narrowed[:1] or t.subjects
        return tuple(dict.fromkeys(found))

    def matches(self, keys: Keys) -> bool:
        return all(value in keys.get(key, ()) for key, value in self.keys.items())


def _check_names(keys: Mapping[str, str]) -> None:
    """FilterError naming the first filter whose value its name rule refuses (KEY_NAMES)."""
    try:
        for key, value in keys.items():
            KEY_NAMES[key](value, key)
    except names.InvalidName as e:
        raise FilterError(str(e)) from None


def parse_filter(types: Sequence[str], keys: Mapping[str, str | None]) -> EventFilter:
    """From query parameters: `types` names (repeated or comma-separated; none: every type) and key filters.
    A key filter narrows to the types that carry that key; FilterError for unknown types, or when no requested
    type carries a requested key."""
    names = [n.strip() for group in types for n in group.split(",") if n.strip()]
    unknown = [n for n in names if n not in BY_NAME]
    if unknown:
        raise FilterError(f"unknown event type(s) {', '.join(map(repr, unknown))}; known: {', '.join(BY_NAME)}")
    given = {k: v for k, v in keys.items() if v}
    bad_keys = [k for k in given if k not in KEYS]
    if bad_keys:
        raise FilterError(f"unknown filter(s) {', '.join(bad_keys)}; known: {', '.join(KEYS)}")
    _check_names(given)
    chosen = [BY_NAME[n] for n in dict.fromkeys(names)] if names else list(CATALOGUE)
    narrowed = [t for t in chosen if all(k in t.keys for k in given)]
    if not narrowed:
        wanted = ", ".join(f"{k}={v}" for k, v in given.items())
        raise FilterError(
            f"no {'requested ' if names else ''}event type can be filtered by {wanted}: "
            + "; ".join(f"{t.name} carries {', '.join(t.keys) or 'no keys'}" for t in chosen)
        )
    return EventFilter(types=tuple(narrowed), keys=given)


# --- cursors


def encode_cursor(positions: Mapping[str, int]) -> str:
    parts = [f"{STREAM_CODES[s]}{seq}" for s, seq in sorted(positions.items(), key=lambda kv: STREAM_CODES[kv[0]])]
    return "-".join([CURSOR_VERSION, *parts])


_PART: Final = re.compile(r"([a-z])(\d{1,19})")


def decode_cursor(text: str) -> dict[str, int]:
    """stream → last sequence delivered; FilterError naming what is wrong with a malformed cursor."""
    version, _, rest = text.strip().partition("-")
    if version != CURSOR_VERSION:
        raise FilterError(f"malformed cursor {text!r}: expected an event id such as '1-m120-q7' (version 1)")
    positions: dict[str, int] = {}
    for part in rest.split("-") if rest else []:
        match = _PART.fullmatch(part)
        if match is None or match.group(1) not in _STREAMS_BY_CODE:
            raise FilterError(f"malformed cursor {text!r}: {part!r} is not <stream code><sequence>")
        positions[_STREAMS_BY_CODE[match.group(1)]] = int(match.group(2))
    return positions


# --- envelopes


def envelope_body(event_type: EventType, *, stream: str, seq: int, time: float, keys: Keys, data: bytes) -> bytes:
    """The envelope after its `id` (which differs per subscription): `,"type":…,"data":…}`."""
    fields = {"type": event_type.name, "time": round(time, 6), "stream": stream, "seq": seq}
    for key in KEYS:
        values = keys.get(key, ())
        fields[key] = values[0] if len(values) == 1 else None
    head = json.dumps(fields, separators=(",", ":"))
    return b"," + head[1:-1].encode() + b',"data":' + (data if _looks_like_json(data) else json.dumps(None).encode())


def envelope(cursor: str, body: bytes) -> bytes:
    return b'{"id":"' + cursor.encode() + b'"' + body + b"}"


def _looks_like_json(data: bytes) -> bool:
    stripped = data.lstrip()
    return bool(stripped) and stripped[:1] in b'{["-0123456789tfn'
