"""What the executor does next for a job that passed arbitration (spec §4.6, EvictDirectly): pure.

`next_step(job, pod, now=, requested_at=, args=)` reads the job (its phase and Eviction condition) and its pod as
the API server has it now (None: gone) and answers one Step: fail it (Timeout once `now − requested ≥ ttl`,
MissingPod when the pod is gone before its eviction started), move it to Running (recording the pod's uid), evict
the pod, call it Succeeded once the evicted pod is gone or replaced (another uid), or nothing to do (None). The
shell (services.migration.executor) performs the step and publishes the resulting MigrationPhaseChanged; a
refused eviction (429: a PodDisruptionBudget) changes nothing and is tried again later. ReservationFirst jobs first
get a Reservation (`reservation_for`: the pod's template away from its node), wait for it to be scheduled elsewhere,
then evict the pod and succeed once a pod has bound the reservation (`reservation_step`, §4.6 steps 6–10); a job
whose reservationOptions.reservationRef names a Reservation uses that one instead of making one; a Reservation
that vanishes, expires, is unschedulable or lands on the pod's own node fails the job.
"""

from __future__ import annotations

import copy
import datetime as dt
import re
from dataclasses import dataclass, field
from typing import Any, Final, Literal

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


_DNS_SUBDOMAIN: Final = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")


def reservation_ref(job: migration.PodMigrationJob) -> tuple[str, str]:
    """(name, problem) of the job's spec.reservationOptions.reservationRef: ("", "") when it has none; a problem
    when it is not an object naming a Reservation by a valid name (it comes from the cluster or the API as
    written, and the name goes into a request path)."""
    options = job.spec.reservation_options or {}
    ref = options.get("reservationRef")
    if ref is None:
        return "", ""
    name = ref.get("name") if isinstance(ref, dict) else None
    if not isinstance(name, str) or not name:
        return "", "spec.reservationOptions.reservationRef must name a Reservation"
    if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        return "", f"spec.reservationOptions.reservationRef: {name[:80]!r} is not a Reservation name"
    return name, ""


def reservation_template(job: migration.PodMigrationJob) -> tuple[dict[str, Any], str]:
    """(template, problem) of the job's spec.reservationOptions.template ({} when it has none): an object whose
    metadata and spec are objects and whose name, if any, is a valid Reservation name."""
    options = job.spec.reservation_options or {}
    template = options.get("template")
    if template is None:
        return {}, ""
    where = "spec.reservationOptions.template"
    if not isinstance(template, dict):
        return {}, f"{where} must be an object"
    meta, spec = template.get("metadata") or {}, template.get("spec") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict):
        return {}, f"{where}: metadata and spec must be objects"
    name = meta.get("name", "")
    if not isinstance(name, str) or (name and (len(name) > 253 or not _DNS_SUBDOMAIN.match(name))):
        return {}, f"{where}.metadata.name: {str(name)[:80]!r} is not a Reservation name"
    labels = meta.get("labels") or {}
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        return {}, f"{where}.metadata.labels must map names to strings"
    return template, ""


def reservation_problem(job: migration.PodMigrationJob) -> str:
    """Why the job's reservationOptions cannot be used ("" when they can)."""
    name, problem = reservation_ref(job)
    return problem or ("" if name else reservation_template(job)[1])


def reservation_name(job: migration.PodMigrationJob) -> str:
    """The job's Reservation: the one its reservationRef names, else the one the executor makes (its template's
    name, else the job's)."""
    given = reservation_ref(job)[0]
    if given:
        return given
    template, _ = reservation_template(job)
    return str((template.get("metadata") or {}).get("name") or job.metadata.name)


def reservation_for(job: migration.PodMigrationJob, pod: kube.Pod, *, ttl: str) -> dict[str, object]:
    """The Reservation the executor makes (§4.6 step 6, Koordinator's CreateOrUpdateReservationOptions): the job's
    reservationOptions.template when it has one (checked by `reservation_problem`), filled in as Koordinator does —
    the pod's template when it gives none, owned by the pod when it names no owners, the job's TTL when it sets
    neither ttl nor expires — and always allocated once, its pod template's node cleared and a required affinity
    away from the pod's node added to every node selector term (matchFields metadata.name NotIn)."""
    template, _ = reservation_template(job)
    given_meta: dict[str, Any] = copy.deepcopy(template.get("metadata") or {})
    spec: dict[str, Any] = copy.deepcopy(template.get("spec") or {})
    meta = pod.metadata
    if not isinstance(spec.get("template"), dict):
        template_meta: dict[str, object] = {"namespace": meta.namespace}
        if meta.labels:
            template_meta["labels"] = dict(meta.labels)
        spec["template"] = {"metadata": template_meta, "spec": json_of(pod.spec)}
    pod_spec = spec["template"].setdefault("spec", {})
    if isinstance(pod_spec, dict):
        pod_spec.pop("nodeName", None)
        if pod.spec.node_name:
            _avoid_node(pod_spec, pod.spec.node_name)
    if not spec.get("owners"):
        spec["owners"] = [{"object": {"namespace": meta.namespace, "name": meta.name, "uid": meta.uid}}]
    spec["allocateOnce"] = True
    if "ttl" not in spec and "expires" not in spec and duration_seconds(ttl) > 0:
        spec["ttl"] = ttl
    labels = {**(given_meta.get("labels") or {}), "koordbus.io/migration-job": job.metadata.name}
    metadata: dict[str, object] = {"name": reservation_name(job), "labels": labels}
    if isinstance(given_meta.get("annotations"), dict):
        metadata["annotations"] = given_meta["annotations"]
    return {"apiVersion": migration.API_VERSION, "kind": "Reservation", "metadata": metadata, "spec": spec}


def _avoid_node(pod_spec: dict[str, Any], node: str) -> None:
    away = {"key": "metadata.name", "operator": "NotIn", "values": [node]}
    affinity = pod_spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.setdefault("nodeSelectorTerms", [])
    for term in terms:
        term.setdefault("matchFields", []).append(away)
    if not terms:
        terms.append({"matchFields": [away]})


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
    given = reservation_ref(job)[0]
    problem = reservation_problem(job)
    if problem:
        return Step("fail", migration.PHASE_FAILED, REASON_MISSING_RESERVATION, problem)
    created = _condition(job, RESERVATION_CREATED)
    evicting = _condition(job, EVICTION)
    if created is None and given:  # an existing Reservation: used, not made (§4.6 step 6)
        if reservation is None:
            return Step("fail", migration.PHASE_FAILED, REASON_MISSING_RESERVATION, f"Reservation {given} not found")
        made = with_condition(
            job, RESERVATION_CREATED, "True", RESERVATION_CREATED, f"uses Reservation {given}", now=stamp
        )
        job = msgspec.structs.replace(job, status=msgspec.structs.replace(job.status, conditions=made))
        created = _condition(job, RESERVATION_CREATED)
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
