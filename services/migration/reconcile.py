"""What the executor does next for a job that passed arbitration (spec §4.6, EvictDirectly): pure.

`next_step(job, pod, now=, requested_at=, args=)` reads the job (its phase and Eviction condition) and its pod as
the API server has it now (None: gone) and answers one Step: fail it (Timeout once `now − requested ≥ ttl`,
MissingPod when the pod is gone before its eviction started), move it to Running (recording the pod's uid), evict
the pod, call it Succeeded once the evicted pod is gone or replaced (another uid), or nothing to do (None). The
shell (services.k8s.migration_executor) performs the step and publishes the resulting MigrationPhaseChanged; a
refused eviction (429: a PodDisruptionBudget) changes nothing and is tried again later. ReservationFirst jobs are
not executed yet: they get one Step saying so and stay Pending.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Final, Literal

from schemas import kube, migration
from schemas.migration import Condition
from services.migration.args import MigrationArgs, duration_seconds

Action = Literal["fail", "run", "evict", "succeed", "note"]
EVICTION: Final = "Eviction"
REASON_EVICTING: Final = "Evicting"
REASON_EVICT_COMPLETE: Final = "EvictComplete"
NOT_YET: Final = "ReservationFirst execution is not implemented yet: request the job with mode EvictDirectly"


@dataclass(frozen=True)
class Step:
    action: Action
    phase: str
    reason: str = ""
    message: str = ""
    conditions: list[Condition] = field(default_factory=list)


def _condition(job: migration.PodMigrationJob, kind: str) -> Condition | None:
    return next((c for c in job.status.conditions if c.type == kind), None)


def with_condition(
    job: migration.PodMigrationJob, kind: str, status: str, reason: str, message: str, *, now: dt.datetime
) -> list[Condition]:
    """The job's conditions with `kind` set (its transition time kept when the status does not change)."""
    held = _condition(job, kind)
    since = held.last_transition_time if held is not None and held.status == status else now
    updated = Condition(
        type=kind, status=status, reason=reason, message=message, last_probe_time=now, last_transition_time=since
    )
    return [c for c in job.status.conditions if c.type != kind] + [updated]


def next_step(
    job: migration.PodMigrationJob,
    pod: kube.Pod | None,
    *,
    now: float,
    requested_at: float,
    args: MigrationArgs,
) -> Step | None:
    phase = migration.phase_of(job)
    if phase in migration.TERMINAL_PHASES or not migration.passed_arbitration(job) or job.spec.paused:
        return None
    stamp = dt.datetime.fromtimestamp(now, dt.UTC)
    ttl = duration_seconds(job.spec.ttl or args.default_job_ttl)
    if ttl > 0 and now - requested_at >= ttl:
        return Step("fail", migration.PHASE_FAILED, migration.REASON_TIMEOUT, f"not finished within its TTL {ttl:g}s")
    mode = job.spec.mode or args.default_job_mode
    if mode != migration.MODE_EVICT_DIRECTLY:
        return None if job.status.message == NOT_YET else Step("note", phase, "", NOT_YET)
    ref = job.spec.pod_ref
    evicting = _condition(job, EVICTION)
    if phase == migration.PHASE_PENDING:
        if pod is None:
            name = f"{ref.namespace}/{ref.name}" if ref else "?"
            return Step("fail", migration.PHASE_FAILED, migration.REASON_MISSING_POD, f"pod {name} not found")
        return Step("run", migration.PHASE_RUNNING, "", f"migrating pod {kube.pod_key(pod)} ({pod.metadata.uid})")
    if evicting is None:
        if pod is None:
            return Step("fail", migration.PHASE_FAILED, migration.REASON_MISSING_POD, "the pod is gone before eviction")
        return Step("evict", phase, "", f"evicting pod {kube.pod_key(pod)}")
    uid = ref.uid if ref is not None else ""
    if pod is None or (uid and pod.metadata.uid != uid):
        conditions = with_condition(job, EVICTION, "True", REASON_EVICT_COMPLETE, "the pod is gone", now=stamp)
        return Step("succeed", migration.PHASE_SUCCEEDED, "", "Complete", conditions)
    return None
