"""Asking for a migration or an abort: the API gateway's way onto KOORD_MIGRATION (the arbiter takes it from there);
and reading the descheduler's rounds.

`request` publishes a MigrationRequested (msg id from the job's name, so a retried request is stored once) and
`abort` a MigrationAborted. `latest_round` reads the descheduler's newest round from KOORD_DESCHEDULER, `plan` asks
the migration service for one computed now without acting (koord.v1.rpc.migration.plan). Errors stay the bus's
(BusUnavailableError when NATS, or for a plan the migration service, does not answer; RemoteError when what came
back is not a round).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

import msgspec

from bus import streams, subjects
from bus.api import Bus, PublishAck, msg_id
from bus.errors import RemoteError
from schemas import migration
from schemas import migration_events as ev
from schemas.descheduler import ROUND_DECODER, DeschedulerRound

PLAN_TIMEOUT_SECONDS = 10.0


class MigrationClient:
    def __init__(self, bus: Bus, *, clock: Callable[[], float] = time.time) -> None:
        self._bus = bus
        self._clock = clock

    def _now(self) -> dt.datetime:
        return dt.datetime.fromtimestamp(self._clock(), dt.UTC)

    async def request(self, job: migration.PodMigrationJob, *, actor: str, source: ev.Source = "api") -> PublishAck:
        """The stream's ack; `duplicate` when a request of that job name was stored moments ago."""
        event = ev.MigrationRequested(job=job, source=source, actor=actor, time=self._now())
        return await self._bus.publish(
            subjects.MIGRATION_REQUESTS,
            ev.encode_migration_event(event),
            msg_id=msg_id("migration.request", job.metadata.name),
        )

    async def abort(self, name: str, *, actor: str) -> int:
        event = ev.MigrationAborted(job=name, actor=actor, time=self._now())
        ack = await self._bus.publish(
            subjects.MIGRATION_ABORTS, ev.encode_migration_event(event), msg_id=msg_id("migration.abort", name)
        )
        return ack.seq

    async def latest_round(self) -> DeschedulerRound | None:
        """The descheduler's newest round; None before its first."""
        delivery = await self._bus.last_on_subject(streams.KOORD_DESCHEDULER, subjects.DESCHEDULER_ROUNDS)
        return None if delivery is None else _round(delivery.data, "the stored round")

    async def plan(self) -> DeschedulerRound:
        """A round computed now by the migration service over what it holds, nothing acted on."""
        data = await self._bus.request(subjects.MIGRATION_RPC_PLAN, b"{}", timeout=PLAN_TIMEOUT_SECONDS)
        return _round(data, "the migration service's answer")


def _round(data: bytes, what: str) -> DeschedulerRound:
    try:
        return ROUND_DECODER.decode(data)
    except (msgspec.ValidationError, msgspec.DecodeError) as err:
        raise RemoteError(f"{what} is not a DeschedulerRound: {err}") from None
