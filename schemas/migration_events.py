"""Pod-migration events (issue 5): requests in, arbitration and lifecycle out, all on the KOORD_MIGRATION stream.

Every way a migration is asked for (a PodMigrationJob in the cluster, `POST /api/v1/migrations`, the load-aware
descheduling loop) becomes one `MigrationRequested` carrying the whole job. Each arbitration round appends one
`MigrationRound` to the arbiter's single-writer subject with optimistic concurrency: requests the intake pre-checks
refused (§4.5: an active job for the pod already, a scheduler name outside schedulerNames in ReservationFirst mode,
no pod reference) with Koordinator's reason, every pass, every failure with the filter and why, and each waiting job
whose holding filter changed — so two arbiter replicas can never both pass a round, and a restart replays exactly
what was decided. `MigrationPhaseChanged` is the executor's progress on a passed job; `MigrationAborted` ends a job
on request; `MigrationCollected` says the executor garbage-collected a finished job, after which every fold forgets
it. Versioned tags; `decode_migration_event` decodes the union.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

import msgspec

from schemas.migration import Condition, PodMigrationJob

Source = Literal["cluster", "api", "descheduler"]
Decision = Literal["passed", "failed", "waiting", "rejected"]


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    time: dt.datetime


class MigrationRequested(_Event, frozen=True, kw_only=True, tag="migration.requested.v1"):
    job: PodMigrationJob
    source: Source
    actor: str = ""


class JobDecision(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    job: str
    outcome: Decision
    filter: str = ""
    """The filter that failed or held the job (arbitration), empty otherwise."""
    reason: str = ""
    """Koordinator's reason for a failure or rejection (ForbiddenMigratePod, InvalidPodRef …)."""
    message: str = ""
    node: str = ""
    """The node of the job's pod when decided (empty: the pod is unknown)."""
    workload: str = ""
    """The uid of the pod's controller when decided."""
    replicas: int = 0
    """That controller's expected replicas when decided (the executor's object limiter scales by it)."""


class MigrationRound(_Event, frozen=True, kw_only=True, tag="migration.round.v1"):
    """What one arbitration round decided: the intake of new requests (rejected ones), then every pass and failure
    and each waiting job whose filter changed. Appended with optimistic concurrency on the arbiter's subject, so
    of two arbiter replicas deciding the same round only one is stored."""

    round: int
    decisions: list[JobDecision]


class MigrationAborted(_Event, frozen=True, kw_only=True, tag="migration.aborted.v1"):
    job: str
    actor: str = ""


class MigrationPhaseChanged(_Event, frozen=True, kw_only=True, tag="migration.phase.v1"):
    """The executor moved a job (§4.6): Running, eviction started, Succeeded, or Failed with Koordinator's reason
    (MissingPod, Timeout …). `conditions` is the job's condition list after the change."""

    job: str
    phase: str
    reason: str = ""
    message: str = ""
    conditions: list[Condition] = []


class MigrationCollected(_Event, frozen=True, kw_only=True, tag="migration.collected.v1"):
    """The executor garbage-collected a finished job (§4.6: its TTL + 5 minutes past, its Reservation and, for a
    cluster job, its PodMigrationJob deleted). Every fold forgets the job — the arbiter's and executor's state, the
    projection's row and trail — so what they hold stays bounded by the jobs not yet collected, and the name may be
    asked for again as a new job, as a PodMigrationJob of that name may be created again once the old one is gone."""

    job: str


MigrationEvent = MigrationRequested | MigrationRound | MigrationAborted | MigrationPhaseChanged | MigrationCollected

_DECODER: msgspec.json.Decoder[MigrationEvent] = msgspec.json.Decoder(MigrationEvent)


def decode_migration_event(data: bytes) -> MigrationEvent:
    return _DECODER.decode(data)


def encode_migration_event(event: MigrationEvent) -> bytes:
    return msgspec.json.encode(event)
