"""What the quota service publishes and answers: computed status on last-value subjects, and its request/reply shapes.

`QuotaStatusComputed` (subject `koord.v1.quota.status.<quota>`, stream KOORD_QUOTA_STATUS) is one quota's latest
object and computed figures with the runtime's explanation, or its tombstone; `QuotaTreeComputed`
(`koord.v1.quota.trees.<tree>`) is one tree's summary: its total, the last event sequence applied, and any problem
(an unusable event skipped, an invariant broken). They are projected for the REST API and read by the Kubernetes
writer. The request shapes (`CommandRequest`, `CheckRequest`, `WhatIfRequest`) and their replies travel over core
NATS request/reply (`koord.v1.rpc.quota.*`) between the API gateway (or the CLI through it) and the quota service.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from schemas import kube
from schemas.quota import ElasticQuota, ElasticQuotaProfile, QuotaRuntimeExplanation, QuotaState
from schemas.quota_events import QuotaCommand, Violation


class QuotaStatusComputed(msgspec.Struct, frozen=True, kw_only=True, tag="quota.status.v1"):
    quota: str
    tree: str
    computed_at: float
    """Unix seconds (the service clock)."""
    events_seq: int
    """The last KOORD_QUOTA sequence the service had applied."""
    deleted: bool = False
    object: ElasticQuota | None = None
    """The quota as stored (resourceVersion = the sequence of the event that last changed it); when deleted, the
    object as it was (so a reader knows its namespace), if the service knows it."""
    state: QuotaState | None = None
    pods: int = 0
    """Pods resolved to this quota (pending and assigned)."""
    explanation: QuotaRuntimeExplanation | None = None
    problems: list[str] = []
    """Invariants this quota breaks now (used above max, its children's runtimes above its own)."""


class QuotaTreeComputed(msgspec.Struct, frozen=True, kw_only=True, tag="quota.tree.v1"):
    tree: str
    computed_at: float
    events_seq: int
    """The last sequence seen on the tree's event subject."""
    total: dict[str, int] = {}
    """What the tree's root distributes before the system/default quotas' used is taken off (default tree: Σ node
    allocatable minus other trees' totals)."""
    quotas: int = 0
    problems: list[str] = []
    """Why the tree may not be what its log says: an unusable event skipped (it stays at its last valid state), an
    invariant broken (used above max, children's runtimes above their parent's)."""


QuotaStatusEvent = QuotaStatusComputed | QuotaTreeComputed
QUOTA_STATUS_DECODER: msgspec.json.Decoder[QuotaStatusEvent] = msgspec.json.Decoder(QuotaStatusEvent)


# --- requests and replies


class CommandRequest(msgspec.Struct, frozen=True, kw_only=True):
    actor: str
    """Who asks (the API token's name); recorded on the event."""
    command: QuotaCommand
    expected_resource_version: str = ""
    """Optimistic concurrency on the object: when set, the command fails with outcome "conflict" unless the
    quota's (or profile's) current resourceVersion is this."""
    dry_run: bool = False
    """Validate only: the reply is "valid" (with the objects as they would be) or "rejected"; nothing is appended."""


Outcome = Literal["applied", "valid", "rejected", "conflict", "unavailable"]


class CommandReply(msgspec.Struct, frozen=True, kw_only=True):
    outcome: Outcome
    message: str = ""
    violations: list[Violation] = []
    tree: str = ""
    seq: int = 0
    """The stream sequence of the (last) event appended."""
    duplicate: bool = False
    """The command id was seen before: nothing new was appended."""
    quota: ElasticQuota | None = None
    """The quota after the command (or as deleted)."""
    profile: ElasticQuotaProfile | None = None
    quotas: list[ElasticQuota] = []
    """Every quota the command created or changed (an import has many), in order."""


class CheckRequest(msgspec.Struct, frozen=True, kw_only=True):
    pods: list[kube.Pod]
    enable_check_parent_quota: bool | None = None
    """Override the service's setting for this check."""


class CheckReply(msgspec.Struct, frozen=True, kw_only=True):
    verdicts: list[Any]
    """services.quota.admission.Verdict as JSON, in the order of the pods."""
    fits: bool


class PodBatch(msgspec.Struct, frozen=True, kw_only=True):
    pod: kube.Pod
    count: int = 1
    assigned: bool = False
    """True: the pods are running (count in used as well as request)."""


class WhatIfRequest(msgspec.Struct, frozen=True, kw_only=True):
    commands: list[QuotaCommand] = []
    pods: list[PodBatch] = []


class QuotaChange(msgspec.Struct, frozen=True, kw_only=True):
    quota: str
    before: QuotaState | None
    after: QuotaState | None


class WhatIfReply(msgspec.Struct, frozen=True, kw_only=True):
    changes: list[QuotaChange]
    """Every quota whose computed state would differ, by name."""
    violations: list[Violation] = []
    """Commands that would be rejected (they are left out of the calculation)."""
    notes: list[str] = []
