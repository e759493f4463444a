"""The migration arbiter's state, folded from KOORD_MIGRATION events, and the intake pre-checks. Pure.

`MigrationState` keeps every job as a PodMigrationJob object reflecting its events: a pass sets the
passed-arbitration annotation (so the next rounds count it as migrating and never consider it again), a failure or
a rejection sets phase Failed with the reason, an abort phase Aborted. `apply` is idempotent per event content
and order-independent for a job's terminal state, so a replay rebuilds exactly what the arbiter had. `intake`
is the §4.5 pre-check of a new request against the jobs held: no other active job for the same pod (by uid or
namespace/name), and in ReservationFirst mode a scheduler name among schedulerNames. `to_publish` turns a round
(services.migration.arbiter) into the events worth appending: every pass and failure, and a waiting job only
when the filter holding it changed.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

import msgspec

from schemas import kube, migration
from schemas import migration_events as ev
from services.migration.arbiter import Round
from services.migration.args import MigrationArgs


class MigrationState:
    def __init__(self) -> None:
        self.jobs: dict[str, migration.PodMigrationJob] = {}
        self.waiting_filter: dict[str, str] = {}
        """Job → the filter that held it in the last round it was told (waiting)."""
        self.round = 0
        """The highest arbiter round folded."""

    def apply(self, event: ev.MigrationEvent) -> None:
        match event:
            case ev.MigrationRequested(job=job):
                name = job.metadata.name
                if name not in self.jobs:
                    self.jobs[name] = job
            case ev.MigrationRejected(job=name, reason=reason, message=message):
                self._finish(name, migration.PHASE_FAILED, reason, message)
            case ev.MigrationArbitrated(job=name, outcome=outcome, filter=which, message=message, round=number):
                self.round = max(self.round, number)
                held = self.jobs.get(name)
                if held is None or migration.phase_of(held) in migration.TERMINAL_PHASES:
                    return
                if outcome == "passed":
                    annotations = {**held.metadata.annotations, migration.ANNOTATION_PASSED_ARBITRATION: "true"}
                    meta = msgspec.structs.replace(held.metadata, annotations=annotations)
                    self.jobs[name] = msgspec.structs.replace(held, metadata=meta)
                    self.waiting_filter.pop(name, None)
                elif outcome == "failed":
                    self._finish(name, migration.PHASE_FAILED, migration.REASON_FORBIDDEN, message)
                else:
                    self.waiting_filter[name] = which
            case ev.MigrationAborted(job=name):
                self._finish(name, migration.PHASE_ABORTED, "Aborted", "aborted on request")

    def _finish(self, name: str, phase: str, reason: str, message: str) -> None:
        job = self.jobs.get(name)
        self.waiting_filter.pop(name, None)
        if job is None or migration.phase_of(job) in migration.TERMINAL_PHASES:
            return
        status = msgspec.structs.replace(job.status, phase=phase, reason=reason, message=message)
        self.jobs[name] = msgspec.structs.replace(job, status=status)

    def passed(self) -> set[str]:
        return {name for name, job in self.jobs.items() if migration.passed_arbitration(job)}

    def waiting(self) -> list[str]:
        return [name for name, job in self.jobs.items() if migration.is_waiting(job)]

    def to_publish(self, result: Round, *, now: dt.datetime) -> list[ev.MigrationArbitrated]:
        """The events a round tells: passes, failures, and waiting jobs whose filter changed."""
        number = self.round + 1
        out = []
        for decision in result.decisions:
            if decision.outcome == "waiting" and self.waiting_filter.get(decision.job) == decision.filter:
                continue
            outcome: ev.ArbitrationOutcome = (
                "passed" if decision.outcome == "passed" else "failed" if decision.outcome == "failed" else "waiting"
            )
            out.append(
                ev.MigrationArbitrated(
                    job=decision.job,
                    outcome=outcome,
                    filter=decision.filter,
                    message=decision.message,
                    round=number,
                    time=now,
                )
            )
        return out


def active_for_pod(jobs: Iterable[migration.PodMigrationJob], pod: kube.Pod) -> str | None:
    """The name of an active (Pending or Running) job for this pod, matched by uid or namespace/name."""
    key, uid = kube.pod_key(pod), pod.metadata.uid
    for job in jobs:
        ref = job.spec.pod_ref
        if ref is None or not migration.is_active(job):
            continue
        if (uid and ref.uid == uid) or f"{ref.namespace}/{ref.name}" == key:
            return job.metadata.name
    return None


def intake(
    job: migration.PodMigrationJob, pod: kube.Pod | None, held: Iterable[migration.PodMigrationJob], args: MigrationArgs
) -> tuple[str, str] | None:
    """(reason, message) when a new request must be refused up front (§4.5 1–2, and a request that names no pod);
    None to take it."""
    ref = job.spec.pod_ref
    if ref is None or not ref.name or not ref.namespace:
        return migration.REASON_INVALID_POD_REF, "spec.podRef needs the pod's namespace and name"
    if pod is None:
        return None  # the reconcile fails it with MissingPod once it passes
    other = active_for_pod((j for j in held if j.metadata.name != job.metadata.name), pod)
    if other is not None:
        return migration.REASON_FORBIDDEN, f"pod {kube.pod_key(pod)} already has an active migration job {other}"
    mode = job.spec.mode or args.default_job_mode
    if mode == migration.MODE_RESERVATION_FIRST and pod.spec.scheduler_name not in args.scheduler_names:
        return (
            migration.REASON_FORBIDDEN,
            f"pod {kube.pod_key(pod)} uses scheduler {pod.spec.scheduler_name or '(default)'}, not one of "
            f"{', '.join(args.scheduler_names)} (ReservationFirst needs it)",
        )
    return None
