"""The streams koordbus keeps, and the consumers its services use, with their limits in one place.

`koordbus up`, the services and the tests call `all_streams()` and `ensure_streams` it; a
service builds its ConsumerSpec from here so that stream names and filters are stated once.
Every stream is bounded by its max age (or keeps one message per subject); `koordbus up` also caps the bytes of the
three that grow with the number of nodes (SizeCaps, from koordbus.settings.EmbeddedStreamSettings).
"""

from __future__ import annotations

from dataclasses import dataclass

from bus import subjects
from bus.api import StreamSpec

KOORD_NODE = "KOORD_NODE"
KOORD_NODEMETRIC = "KOORD_NODEMETRIC"
KOORD_PREDICTION = "KOORD_PREDICTION"
KOORD_DLQ = "KOORD_DLQ"
KOORD_CLUSTER = "KOORD_CLUSTER"
KOORD_NODERESOURCE = "KOORD_NODERESOURCE"
KOORD_QUOTA = "KOORD_QUOTA"
KOORD_QUOTA_STATUS = "KOORD_QUOTA_STATUS"
KOORD_MIGRATION = "KOORD_MIGRATION"
KOORD_DESCHEDULER = "KOORD_DESCHEDULER"
KOORD_MEMBERS = "KOORD_MEMBERS"
KOORD_CCP = "KOORD_CCP"
KV_KOORD_SLO = f"KV_{subjects.SLO_BUCKET}"

# Consumers ack within 30 s and try 5 times: dedup must outlive 150 s of redeliveries.
DUPLICATE_WINDOW_SECONDS = 300.0


@dataclass(frozen=True, kw_only=True)
class SizeCaps:
    """The most bytes each high-volume stream keeps (-1: no cap, only its max age; None: the operator's — a stream
    is created without a cap and an existing stream keeps the cap it has). A full stream drops its oldest messages as
    new ones arrive (JetStream's default discard policy, `old`): a publish is never refused, and what depends on
    history reads what is left (a consumer asking for older messages starts at the oldest kept; an event cursor older
    than that gets a warning)."""

    node: int | None = None
    """KOORD_NODE: agent reports, actuations, evictions."""
    nodemetric: int | None = None
    """KOORD_NODEMETRIC: NodeMetric reports."""
    noderesource: int | None = None
    """KOORD_NODERESOURCE: batch/mid decisions and the colocation config status."""


OPERATOR_CAPS = SizeCaps()
"""What a service joining a cluster's NATS asks for: the caps the operator put on the streams stay (a service's start
once lifted a bench's 20 GB cap on KOORD_NODE, and the stream filled the disk)."""


def node_stream(*, max_age_seconds: float = 2 * 3600, max_bytes: int | None = -1, replicas: int = 1) -> StreamSpec:
    """Raw agent reports. Kept longer than the longest aggregation window (30 min) so a restarted
    nodemetric replica can rebuild its windows from the stream. Stored with each node's partition appended
    (subjects.NODE_TRANSFORM)."""
    return StreamSpec(
        name=KOORD_NODE,
        subjects=(subjects.NODE_ALL,),
        max_age_seconds=max_age_seconds,
        max_bytes=max_bytes,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
        subject_transform=subjects.NODE_TRANSFORM,
    )


def nodemetric_stream(
    *, max_age_seconds: float = 24 * 3600, max_bytes: int | None = -1, replicas: int = 1
) -> StreamSpec:
    """NodeMetricComputed reports, stored with each node's partition appended (subjects.NODEMETRIC_TRANSFORM) so
    noderesource replicas can each consume a share of the nodes."""
    return StreamSpec(
        name=KOORD_NODEMETRIC,
        subjects=(subjects.NODEMETRIC_ALL,),
        max_age_seconds=max_age_seconds,
        max_bytes=max_bytes,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
        subject_transform=subjects.NODEMETRIC_TRANSFORM,
    )


def prediction_stream(*, max_age_seconds: float = 2 * 24 * 3600, replicas: int = 1) -> StreamSpec:
    """The nodemetric service's prod-predictor models, the last snapshot per node (schemas.prediction), stored with
    each node's partition appended so a replica reads back only the nodes it owns. Kept two days: past the
    predictor's 24-hour cold start a node's snapshot is worth little, and a node gone that long takes it along."""
    return StreamSpec(
        name=KOORD_PREDICTION,
        subjects=(subjects.PREDICTION_ALL,),
        max_age_seconds=max_age_seconds,
        max_msgs_per_subject=1,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
        subject_transform=subjects.PREDICTION_TRANSFORM,
    )


def cluster_stream(*, replicas: int = 1) -> StreamSpec:
    """What services.k8s sees: one message (the latest state or a tombstone) per object subject, kept forever,
    so a starting service reads current cluster state with a last-per-subject replay."""
    return StreamSpec(
        name=KOORD_CLUSTER,
        subjects=(subjects.CLUSTER_ALL,),
        max_age_seconds=0,
        max_msgs_per_subject=1,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
    )


def noderesource_stream(
    *, max_age_seconds: float = 7 * 24 * 3600, max_bytes: int | None = -1, replicas: int = 1
) -> StreamSpec:
    """Every batch/mid decision with its explanation: the replayable history behind `/resources/history`; also
    the colocation config status (a last-value subject, read with last_per_subject). Direct gets on: an agent reads
    its own node's last decision (its batch allocatable, for the allocatable evictions), which a permission can
    grant subject by subject."""
    return StreamSpec(
        name=KOORD_NODERESOURCE,
        subjects=(subjects.NODERESOURCE_ALL,),
        max_age_seconds=max_age_seconds,
        max_bytes=max_bytes,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
        allow_direct=True,
    )


def quota_stream(*, replicas: int = 1) -> StreamSpec:
    """The quota trees' event log, one subject per tree: the source of truth, kept forever."""
    return StreamSpec(
        name=KOORD_QUOTA,
        subjects=(subjects.QUOTA_EVENTS_ALL,),
        max_age_seconds=0,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
    )


def quota_status_stream(*, replicas: int = 1) -> StreamSpec:
    """Each quota's and each tree's latest computed status (runtime, request, used, explanation): last values,
    rebuilt by the quota service from KOORD_QUOTA and the cluster whenever needed."""
    return StreamSpec(
        name=KOORD_QUOTA_STATUS,
        subjects=(subjects.QUOTA_STATUS_ALL, subjects.QUOTA_TREES_ALL),
        max_age_seconds=0,
        max_msgs_per_subject=1,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
    )


def migration_stream(*, max_age_seconds: float = 7 * 24 * 3600, replicas: int = 1) -> StreamSpec:
    """Migration requests, arbitration rounds and aborts: the arbiter's state is this log folded, so it is kept
    well past any job's TTL (default 5 minutes)."""
    return StreamSpec(
        name=KOORD_MIGRATION,
        subjects=(subjects.MIGRATION_ALL,),
        max_age_seconds=max_age_seconds,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
    )


DESCHEDULER_ROUNDS_KEPT = 100
"""The descheduler's last rounds kept (its view lists at most schemas.descheduler.MAX_ROUND_NODES nodes each)."""


def descheduler_stream(*, replicas: int = 1) -> StreamSpec:
    """The descheduler's rounds as it decided them (schemas.descheduler): the last 100, kept a day, for the API."""
    return StreamSpec(
        name=KOORD_DESCHEDULER,
        subjects=(subjects.DESCHEDULER_ROUNDS,),
        max_age_seconds=24 * 3600,
        max_msgs_per_subject=DESCHEDULER_ROUNDS_KEPT,
        duplicate_window_seconds=60.0,
        replicas=replicas,
    )


def slo_stream(*, replicas: int = 1) -> StreamSpec:
    """The rendered NodeSLO specs as a JetStream key-value bucket (`nats kv get KOORD_SLO <node>` reads one): the
    latest value per key, kept forever. Each agent reads only its own node's key."""
    return StreamSpec(
        name=KV_KOORD_SLO,
        subjects=(subjects.SLO_ALL,),
        max_age_seconds=0,
        max_msgs_per_subject=1,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
        allow_direct=True,
    )


MAX_STORED_PROFILES = 10_000
"""The most profile names KOORD_CCP holds, live and deleted (a tombstone stays as its subject's last message): the
REST API refuses a profile of a new name past it, so reading them all stays one bounded pass."""


def ccp_stream(*, replicas: int = 1) -> StreamSpec:
    """The ClusterColocationProfiles koordbus holds (the REST API's, schemas.colocation_events): the latest version
    or the tombstone of each, kept forever, like the cluster's objects on KOORD_CLUSTER."""
    return StreamSpec(
        name=KOORD_CCP,
        subjects=(subjects.PROFILES_ALL,),
        max_age_seconds=0,
        max_msgs_per_subject=1,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
    )


def dlq_stream(*, max_age_seconds: float = 7 * 24 * 3600, replicas: int = 1) -> StreamSpec:
    return StreamSpec(
        name=KOORD_DLQ,
        subjects=(subjects.DLQ_ALL,),
        max_age_seconds=max_age_seconds,
        duplicate_window_seconds=DUPLICATE_WINDOW_SECONDS,
        replicas=replicas,
    )


def members_stream(*, replicas: int = 1) -> StreamSpec:
    """Service replicas' heartbeats (services.common.membership): the last one per replica, kept a day."""
    return StreamSpec(
        name=KOORD_MEMBERS,
        subjects=(subjects.MEMBERS_ALL,),
        max_age_seconds=24 * 3600,
        max_msgs_per_subject=1,
        duplicate_window_seconds=60.0,
        replicas=replicas,
    )


def all_streams(*, replicas: int = 1, caps: SizeCaps = OPERATOR_CAPS) -> list[StreamSpec]:
    return [
        node_stream(max_bytes=caps.node, replicas=replicas),
        nodemetric_stream(max_bytes=caps.nodemetric, replicas=replicas),
        prediction_stream(replicas=replicas),
        cluster_stream(replicas=replicas),
        noderesource_stream(max_bytes=caps.noderesource, replicas=replicas),
        quota_stream(replicas=replicas),
        quota_status_stream(replicas=replicas),
        migration_stream(replicas=replicas),
        descheduler_stream(replicas=replicas),
        slo_stream(replicas=replicas),
        dlq_stream(replicas=replicas),
        members_stream(replicas=replicas),
        ccp_stream(replicas=replicas),
    ]
