"""Asking for a migration or an abort: the API gateway's way onto KOORD_MIGRATION (the arbiter takes it from there).

`request` publishes a MigrationRequested (msg id from the job's name, so a retried request is stored once) and
`abort` a MigrationAborted. Errors stay the bus's (BusUnavailableError when NATS does not answer).
"""

from __future__ import annotations

import datetime as dt
import time
from collections.abc import Callable

from bus import subjects
from bus.api import Bus, PublishAck, msg_id
from schemas import migration
from schemas import migration_events as ev


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
