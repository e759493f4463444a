"""What the executor does next for a job that passed arbitration (spec §4.6, EvictDirectly): pure.

`next_step(job, pod, now=, requested_at=, args=)` reads the job (its phase and Eviction condition) and its pod as
the API server has it now (None: gone) and answers one Step: fail it (Timeout once `now − requested ≥ ttl`,
MissingPod when the pod is gone before its eviction started), move it to Running (recording the pod's uid), evict
the pod, call it Succeeded once the evicted pod is gone or replaced (another uid), or nothing to do (None). The
shell (services.k8s.migration_executor) performs the step and publishes the resulting MigrationPhaseChanged; a
refused eviction (429: a PodDisruptionBudget) changes nothing and is tried again later. ReservationFirst jobs first
get a Reservation (`reservation_for`: the pod's template away from its node), wait for it to be scheduled elsewhere,
then evict the pod and succeed once a pod has bound the reservation (`reservation_step`, §4.6 steps 6–10); a
Reservation that vanishes, expires, is unschedulable or lands on the pod's own node fails the job.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Final, Literal

import msgspec

from schemas import kube, migration
from schemas.migration import Condition
from services.migration.args import MigrationArgs, duration_seconds

Action = Literal["fail", "run", "evict", "succeed", "note", "reserve"]
EVICTION: Final = "Eviction"
REASON_EVICTING: Final = "Evicting"
REASON_EVICT_COMPLETE: Final = "EvictComplete"


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


def mode_of(job: migration.PodMigrationJob, args: MigrationArgs) -> str:
    return job.spec.mode or args.default_job_mode


def next_step(
    job: migration.PodMigrationJob,
    pod: kube.Pod | None,
    *,
    now: float,
    requested_at: float,
    args: MigrationArgs,
    reservation: dict[str, object] | None = None,
) -> Step | None:
    """The next step of a passed job; `reservation` is the job's Reservation as the API server has it (None: not
    there), read by the shell for ReservationFirst jobs."""
    phase = migration.phase_of(job)
    if phase in migration.TERMINAL_PHASES or not migration.passed_arbitration(job) or job.spec.paused:
        return None
    stamp = dt.datetime.fromtimestamp(now, dt.UTC)
    ttl = duration_seconds(job.spec.ttl or args.default_job_ttl)
    if ttl > 0 and now - requested_at >= ttl:
        return Step("fail", migration.PHASE_FAILED, migration.REASON_TIMEOUT, f"not finished within its TTL {ttl:g}s")
    ref = job.spec.pod_ref
    evicting = _condition(job, EVICTION)
    if phase == migration.PHASE_PENDING:
        if pod is None:
            name = f"{ref.namespace}/{ref.name}" if ref else "?"
            return Step("fail", migration.PHASE_FAILED, migration.REASON_MISSING_POD, f"pod {name} not found")
        return Step("run", migration.PHASE_RUNNING, "", f"migrating pod {kube.pod_key(pod)} ({pod.metadata.uid})")
    if mode_of(job, args) == migration.MODE_RESERVATION_FIRST:
        return reservation_step(job, pod, reservation, now=now)
    if evicting is None:
        if pod is None:
            return Step("fail", migration.PHASE_FAILED, migration.REASON_MISSING_POD, "the pod is gone before eviction")
        return Step("evict", phase, "", f"evicting pod {kube.pod_key(pod)}")
    uid = ref.uid if ref is not None else ""
    if pod is None or (uid and pod.metadata.uid != uid):
        conditions = with_condition(job, EVICTION, "True", REASON_EVICT_COMPLETE, "the pod is gone", now=stamp)
        return Step("succeed", migration.PHASE_SUCCEEDED, "", "Complete", conditions)
    return None


# --- ReservationFirst (§4.6 steps 6–10)

RESERVATION_CREATED: Final = "ReservationCreated"
RESERVATION_SCHEDULED: Final = "ReservationScheduled"
POD_BOUND: Final = "PodBoundReservation"
REASON_MISSING_RESERVATION: Final = "MissingReservation"
REASON_RESERVATION_EXPIRED: Final = "ReservationExpired"
REASON_UNSCHEDULABLE: Final = "Unschedulable"


def reservation_for(job: migration.PodMigrationJob, pod: kube.Pod, *, ttl: str) -> dict[str, object]:
    """The Reservation the default template makes (§4.6 step 6): named after the job, the pod's template with its
    node cleared and a required affinity away from that node, owned by the pod, allocated once, the job's TTL."""
    meta = pod.metadata
    spec = json_of(pod.spec)
    spec.pop("nodeName", None)
    spec["affinity"] = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "metadata.name", "operator": "NotIn", "values": [pod.spec.node_name]}
                        ]
                    }
                ]
            }
        }
    }
    template_meta: dict[str, object] = {"namespace": meta.namespace}
    if meta.labels:
        template_meta["labels"] = dict(meta.labels)
    return {
        "apiVersion": migration.API_VERSION,
        "kind": "Reservation",
        "metadata": {"name": job.metadata.name, "labels": {"koordbus.io/migration-job": job.metadata.name}},
        "spec": {
            "template": {"metadata": template_meta, "spec": spec},
            "owners": [{"object": {"namespace": meta.namespace, "name": meta.name, "uid": meta.uid}}],
            "allocateOnce": True,
            "ttl": ttl,
        },
    }


def json_of(value: object) -> dict[str, object]:
    """A struct as plain JSON, empty fields left out."""
    out = msgspec.json.decode(msgspec.json.encode(value))
    assert isinstance(out, dict)
    return {k: v for k, v in out.items() if v not in (None, [], {}, "")}


def reservation_step(
    job: migration.PodMigrationJob, pod: kube.Pod | None, reservation: dict[str, object] | None, *, now: float
) -> Step | None:
    """The next step of a Running ReservationFirst job: reserve, wait, evict, or finish."""
    stamp = dt.datetime.fromtimestamp(now, dt.UTC)
    created = _condition(job, RESERVATION_CREATED)
    evicting = _condition(job, EVICTION)
    if created is None:
        if pod is None:
            return Step("fail", migration.PHASE_FAILED, migration.REASON_MISSING_POD, "the pod is gone")
        conditions = with_condition(job, RESERVATION_CREATED, "True", RESERVATION_CREATED, "", now=stamp)
        return Step("reserve", migration.PHASE_RUNNING, "", "reservation requested", conditions)
    if reservation is None:
        return Step("fail", migration.PHASE_FAILED, REASON_MISSING_RESERVATION, "the Reservation is gone")
    status = reservation.get("status") or {}
    assert isinstance(status, dict)
    phase, node = str(status.get("phase", "")), str(status.get("nodeName", ""))
    if phase in ("Failed", "Expired"):
        return Step("fail", migration.PHASE_FAILED, REASON_RESERVATION_EXPIRED, f"the Reservation is {phase}")
    for condition in status.get("conditions") or []:
        if isinstance(condition, dict) and condition.get("reason") == REASON_UNSCHEDULABLE:
            message = str(condition.get("message", "no node fits the reservation"))
            return Step("fail", migration.PHASE_FAILED, REASON_UNSCHEDULABLE, message)
    if not node:
        return None  # not scheduled yet
    if pod is not None and evicting is None and node == pod.spec.node_name:
        return Step("fail", migration.PHASE_FAILED, migration.REASON_FORBIDDEN, f"reserved on the same node {node}")
    if evicting is None:
        if pod is None:
            return Step("fail", migration.PHASE_FAILED, migration.REASON_MISSING_POD, "the pod is gone before eviction")
        conditions = with_condition(job, RESERVATION_SCHEDULED, "True", RESERVATION_SCHEDULED, node, now=stamp)
        return Step("evict", migration.PHASE_RUNNING, "", f"reserved on {node}: evicting", conditions)
    uid = job.spec.pod_ref.uid if job.spec.pod_ref else ""
    gone = pod is None or bool(uid and pod.metadata.uid != uid)
    current = job
    if gone and evicting.status != "True":
        done = with_condition(job, EVICTION, "True", REASON_EVICT_COMPLETE, "the pod is gone", now=stamp)
        current = msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, conditions=done))
    owners = status.get("currentOwners") or []
    if owners:
        conditions = with_condition(current, POD_BOUND, "True", "ReservationBound", str(owners[0]), now=stamp)
        return Step("succeed", migration.PHASE_SUCCEEDED, "", "Complete", conditions)
    if gone and _condition(job, POD_BOUND) is None:
        conditions = with_condition(current, POD_BOUND, "False", "WaitForPodBindReservation", "", now=stamp)
        return Step("note", migration.PHASE_RUNNING, "", "waiting for a pod to bind the reservation", conditions)
    return None
