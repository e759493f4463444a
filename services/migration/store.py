"""The migration projections: every job with where it stands, and each job's decision trail.

Written by the migration service's projector from KOORD_MIGRATION (`apply_events`): a MigrationRequested makes a
`migration_jobs` row (the first request per name wins, as in the arbiter), each decision of a MigrationRound a
`migration_decisions` row and moves its job's arbitration outcome and phase (passed; Failed for a failure or a
rejection, with the reason), a MigrationAborted ends the job, and a MigrationCollected deletes a finished job's row
and trail (as the cluster deletes a collected PodMigrationJob; a later request of the name starts afresh). The
projector records its stream offset in the same transaction and skips what it already has, so redelivery is a no-op
and a fresh database replays the stream.
Read by services.migration.routes (list with filters, one job with its trail).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, Final, cast

import msgspec
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.orm import Mapped, mapped_column

from schemas import migration
from schemas import migration_events as ev
from services.common import db


class MigrationJobRow(db.Base):
    __tablename__ = "migration_jobs"
    __table_args__ = (sa.Index("ix_migration_jobs_phase", "phase"),)

    name: Mapped[str] = mapped_column(sa.String(253), primary_key=True)
    namespace: Mapped[str] = mapped_column(sa.String(253), index=True)
    pod: Mapped[str] = mapped_column(sa.String(253))
    node: Mapped[str] = mapped_column(sa.String(253), index=True)
    workload: Mapped[str] = mapped_column(sa.String(253), index=True)
    phase: Mapped[str] = mapped_column(sa.String(32))
    arbitration: Mapped[str] = mapped_column(sa.String(32))
    """new | waiting | passed | failed | rejected"""
    reason: Mapped[str] = mapped_column(sa.String(253))
    message: Mapped[str] = mapped_column(sa.Text)
    source: Mapped[str] = mapped_column(sa.String(32))
    actor: Mapped[str] = mapped_column(sa.String(253))
    requested_at: Mapped[float] = mapped_column(sa.Double)
    updated_at: Mapped[float] = mapped_column(sa.Double)
    job: Mapped[str] = mapped_column(sa.Text)
    """The PodMigrationJob as requested (JSON)."""


class MigrationDecisionRow(db.Base):
    __tablename__ = "migration_decisions"

    stream_seq: Mapped[int] = mapped_column(sa.BigInteger, primary_key=True)
    job: Mapped[str] = mapped_column(sa.String(253), primary_key=True, index=True)
    round: Mapped[int] = mapped_column(sa.BigInteger)
    outcome: Mapped[str] = mapped_column(sa.String(32))
    filter: Mapped[str] = mapped_column(sa.String(253))
    reason: Mapped[str] = mapped_column(sa.String(253))
    message: Mapped[str] = mapped_column(sa.Text)
    time: Mapped[float] = mapped_column(sa.Double)


_JOBS: Final = cast(sa.Table, MigrationJobRow.__table__)
_DECISIONS: Final = cast(sa.Table, MigrationDecisionRow.__table__)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class JobRecord:
    name: str
    namespace: str
    pod: str
    node: str
    workload: str
    phase: str
    arbitration: str
    reason: str
    message: str
    source: str
    actor: str
    requested_at: float
    updated_at: float
    job: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DecisionRecord:
    stream_seq: int
    round: int
    outcome: str
    filter: str
    reason: str
    message: str
    time: float


class MigrationStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def offset(self, consumer: str) -> int:
        async with self._engine.connect() as connection:
            return await db.read_offset(connection, consumer)

    async def apply_events(self, items: Sequence[tuple[int, ev.MigrationEvent]], *, consumer: str, stream: str) -> int:
        async def write(connection: AsyncConnection, fresh: list[tuple[int, ev.MigrationEvent]]) -> int:
            for seq, event in fresh:
                await self._apply(connection, seq, event)
            return len(fresh)

        return await db.project_batch(self._engine, items, consumer=consumer, stream=stream, write=write)

    async def _apply(self, connection: AsyncConnection, seq: int, event: ev.MigrationEvent) -> None:
        at = event.time.timestamp()
        match event:
            case ev.MigrationRequested(job=job, source=source, actor=actor):
                ref = job.spec.pod_ref
                exists = (
                    await connection.execute(sa.select(_JOBS.c.name).where(_JOBS.c.name == job.metadata.name))
                ).first()
                if exists is not None:
                    return
                await connection.execute(
                    sa.insert(_JOBS),
                    [
                        {
                            "name": job.metadata.name,
                            "namespace": ref.namespace if ref else "",
                            "pod": ref.name if ref else "",
                            "node": "",
                            "workload": "",
                            "phase": migration.phase_of(job),
                            "arbitration": "new",
                            "reason": job.status.reason,
                            "message": job.status.message,
                            "source": source,
                            "actor": actor,
                            "requested_at": at,
                            "updated_at": at,
                            "job": msgspec.json.encode(job).decode(),
                        }
                    ],
                )
            case ev.MigrationRound(round=number, decisions=decisions):
                rows = [
                    {
                        "stream_seq": seq,
                        "job": d.job,
                        "round": number,
                        "outcome": d.outcome,
                        "filter": d.filter,
                        "reason": d.reason,
                        "message": d.message,
                        "time": at,
                    }
                    for d in decisions
                ]
                if rows:
                    await connection.execute(sa.insert(_DECISIONS), rows)
                for d in decisions:
                    values: dict[str, Any] = {"arbitration": d.outcome, "updated_at": at, "message": d.message}
                    if d.node:
                        values["node"] = d.node
                    if d.workload:
                        values["workload"] = d.workload
                    if d.outcome in ("failed", "rejected"):
                        values.update(phase=migration.PHASE_FAILED, reason=d.reason)
                    await connection.execute(
                        sa.update(_JOBS)
                        .where(_JOBS.c.name == d.job, _JOBS.c.phase.notin_(sorted(migration.TERMINAL_PHASES)))
                        .values(**values)
                    )
            case ev.MigrationPhaseChanged(job=name, phase=phase, reason=reason, message=message):
                await connection.execute(
                    sa.insert(_DECISIONS),
                    [
                        {
                            "stream_seq": seq,
                            "job": name,
                            "round": 0,
                            "outcome": f"phase {phase}",
                            "filter": "",
                            "reason": reason,
                            "message": message,
                            "time": at,
                        }
                    ],
                )
                await connection.execute(
                    sa.update(_JOBS)
                    .where(_JOBS.c.name == name, _JOBS.c.phase.notin_(sorted(migration.TERMINAL_PHASES)))
                    .values(phase=phase, reason=reason, message=message, updated_at=at)
                )
            case ev.MigrationAborted(job=name, actor=actor):
                await connection.execute(
                    sa.update(_JOBS)
                    .where(_JOBS.c.name == name, _JOBS.c.phase.notin_(sorted(migration.TERMINAL_PHASES)))
                    .values(
                        phase=migration.PHASE_ABORTED, reason="Aborted", message=f"aborted by {actor}", updated_at=at
                    )
                )
            case ev.MigrationCollected(job=name):
                finished = (
                    await connection.execute(
                        sa.delete(_JOBS).where(
                            _JOBS.c.name == name, _JOBS.c.phase.in_(sorted(migration.TERMINAL_PHASES))
                        )
                    )
                ).rowcount
                if finished:
                    await connection.execute(sa.delete(_DECISIONS).where(_DECISIONS.c.job == name))

    async def jobs(
        self,
        *,
        phase: str | None = None,
        node: str | None = None,
        namespace: str | None = None,
        workload: str | None = None,
        limit: int = 500,
    ) -> list[JobRecord]:
        query = sa.select(_JOBS).order_by(_JOBS.c.requested_at.desc(), _JOBS.c.name).limit(limit)
        for column, value in ((_JOBS.c.phase, phase), (_JOBS.c.node, node), (_JOBS.c.namespace, namespace)):
            if value is not None:
                query = query.where(column == value)
        if workload is not None:
            query = query.where(_JOBS.c.workload == workload)
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).mappings().all()
        return [_job_record(row) for row in rows]

    async def job(self, name: str) -> JobRecord | None:
        async with self._engine.connect() as connection:
            row = (await connection.execute(sa.select(_JOBS).where(_JOBS.c.name == name))).mappings().first()
        return None if row is None else _job_record(row)

    async def trail(self, name: str) -> list[DecisionRecord]:
        query = sa.select(_DECISIONS).where(_DECISIONS.c.job == name).order_by(_DECISIONS.c.stream_seq)
        async with self._engine.connect() as connection:
            rows = (await connection.execute(query)).mappings().all()
        return [
            DecisionRecord(
                stream_seq=row["stream_seq"],
                round=row["round"],
                outcome=row["outcome"],
                filter=row["filter"],
                reason=row["reason"],
                message=row["message"],
                time=row["time"],
            )
            for row in rows
        ]


def _job_record(row: Any) -> JobRecord:
    return JobRecord(
        name=row["name"],
        namespace=row["namespace"],
        pod=row["pod"],
        node=row["node"],
        workload=row["workload"],
        phase=row["phase"],
        arbitration=row["arbitration"],
        reason=row["reason"],
        message=row["message"],
        source=row["source"],
        actor=row["actor"],
        requested_at=row["requested_at"],
        updated_at=row["updated_at"],
        job=msgspec.json.decode(row["job"]),
    )
