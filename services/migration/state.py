"""The migration arbiter's state, folded from KOORD_MIGRATION events, and the intake pre-checks. Pure.

`MigrationState` keeps every job not yet collected as a PodMigrationJob object reflecting its events: a pass sets
the passed-arbitration annotation (so the next rounds count it as migrating and never consider it again), a failure
or a rejection sets phase Failed with the reason, an abort phase Aborted, and the executor's MigrationCollected of a
finished job forgets it (a later request of that name is a new job). A replay of the events rebuilds exactly what
the arbiter had. `intake` is the §4.5 pre-check of a new request against the jobs held: no other active job for the
same pod (by uid or namespace/name), and in ReservationFirst mode a scheduler name among schedulerNames.
`to_tell` turns a round (services.migration.arbiter) into the decisions worth appending: every pass and failure,
and a waiting job only when the filter holding it changed.
"""

from __future__ import annotations

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
        self.requested_at: dict[str, float] = {}
        """Job → when its request was made (unix seconds): the TTL runs from here."""
        self.told: set[str] = set()
        """Jobs some round decided something about (the others are new: they go through the intake first)."""

    def apply(self, event: ev.MigrationEvent) -> None:
        match event:
            case ev.MigrationRequested(job=job, time=at):
                name = job.metadata.name
                if name not in self.jobs:
                    self.jobs[name] = job
                    self.requested_at[name] = at.timestamp()
            case ev.MigrationRound(round=number, decisions=decisions):
                self.round = max(self.round, number)
                for decision in decisions:
                    self._decide(decision)
            case ev.MigrationAborted(job=name):
                self._finish(name, migration.PHASE_ABORTED, "Aborted", "aborted on request")
            case ev.MigrationPhaseChanged(job=name, phase=phase, reason=reason, message=message, conditions=conds):
                held = self.jobs.get(name)
                if held is None or migration.phase_of(held) in migration.TERMINAL_PHASES:
                    return
                status = msgspec.structs.replace(
                    held.status, phase=phase, reason=reason, message=message, conditions=list(conds)
                )
                self.jobs[name] = msgspec.structs.replace(held, status=status)
            case ev.MigrationCollected(job=name):
                held = self.jobs.get(name)
                if held is not None and migration.phase_of(held) in migration.TERMINAL_PHASES:
                    self._forget(name)

    def _forget(self, name: str) -> None:
        del self.jobs[name]
        self.requested_at.pop(name, None)
        self.waiting_filter.pop(name, None)
        self.told.discard(name)

    def _decide(self, decision: ev.JobDecision) -> None:
        name = decision.job
        held = self.jobs.get(name)
        if held is None:
            return  # a job collected meanwhile: a later request of its name is new, not told
        self.told.add(name)
        if migration.phase_of(held) in migration.TERMINAL_PHASES:
            return
        match decision.outcome:
            case "passed":
                annotations = {**held.metadata.annotations, migration.ANNOTATION_PASSED_ARBITRATION: "true"}
                meta = msgspec.structs.replace(held.metadata, annotations=annotations)
                self.jobs[name] = msgspec.structs.replace(held, metadata=meta)
                self.waiting_filter.pop(name, None)
            case "failed" | "rejected":
                self._finish(
                    name, migration.PHASE_FAILED, decision.reason or migration.REASON_FORBIDDEN, decision.message
                )
            case "waiting":
                self.waiting_filter[name] = decision.filter

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

    def new_jobs(self) -> list[str]:
        """Waiting jobs no round has decided anything about yet."""
        return [name for name in self.waiting() if name not in self.told]

    def to_tell(self, result: Round) -> list[ev.JobDecision]:
        """What a round has to tell: passes, failures, and waiting jobs whose filter changed."""
        out = []
        for decision in result.decisions:
            if decision.outcome == "waiting":
                if self.waiting_filter.get(decision.job) == decision.filter:
                    continue
                out.append(
                    ev.JobDecision(
                        job=decision.job, outcome="waiting", filter=decision.filter, message=decision.message
                    )
                )
            elif decision.outcome == "failed":
                out.append(
                    ev.JobDecision(
                        job=decision.job,
                        outcome="failed",
                        filter=decision.filter,
                        reason=migration.REASON_FORBIDDEN,
                        message=f"pod is forbidden to migrate: {decision.message}",
                    )
                )
            else:
                out.append(ev.JobDecision(job=decision.job, outcome="passed", message=decision.message))
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
