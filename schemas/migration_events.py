"""Pod-migration events (issue 5): requests in, arbitration and lifecycle out, all on the KOORD_MIGRATION stream.

Every way a migration is asked for (a PodMigrationJob in the cluster, `POST /api/v1/migrations`, the load-aware
descheduling loop) becomes one `MigrationRequested` carrying the whole job; `MigrationRejected` records a request
the intake pre-checks refused (§4.5: an active job for the pod already, a scheduler name outside schedulerNames in
ReservationFirst mode), with Koordinator's reason. The arbiter appends `MigrationArbitrated` (passed, failed with
the filter and why, or waiting with the filter that held it, told only when it changes) to its single-writer
subject with optimistic concurrency, so two arbiter replicas can never both pass a round. `MigrationAborted` ends a
job on request. Versioned tags; `decode_migration_event` decodes the union.
"""

from __future__ import annotations

import datetime as dt
from typing import Literal

import msgspec

from schemas.migration import PodMigrationJob

Source = Literal["cluster", "api", "descheduler"]
ArbitrationOutcome = Literal["passed", "failed", "waiting"]


class _Event(msgspec.Struct, frozen=True, kw_only=True, tag_field="type"):
    time: dt.datetime


class MigrationRequested(_Event, frozen=True, kw_only=True, tag="migration.requested.v1"):
    job: PodMigrationJob
    source: Source
    actor: str = ""


class MigrationRejected(_Event, frozen=True, kw_only=True, tag="migration.rejected.v1"):
    job: str
    reason: str
    message: str


class MigrationArbitrated(_Event, frozen=True, kw_only=True, tag="migration.arbitrated.v1"):
    job: str
    outcome: ArbitrationOutcome
    filter: str = ""
    message: str = ""
    round: int = 0
    """The arbiter's round number (rounds with nothing to tell publish nothing)."""


class MigrationAborted(_Event, frozen=True, kw_only=True, tag="migration.aborted.v1"):
    job: str
    actor: str = ""


MigrationEvent = MigrationRequested | MigrationRejected | MigrationArbitrated | MigrationAborted

_DECODER: msgspec.json.Decoder[MigrationEvent] = msgspec.json.Decoder(MigrationEvent)


def decode_migration_event(data: bytes) -> MigrationEvent:
    return _DECODER.decode(data)


def encode_migration_event(event: MigrationEvent) -> bytes:
    return msgspec.json.encode(event)
