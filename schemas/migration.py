"""PodMigrationJob (scheduling.koordinator.sh/v1alpha1) and the workloads the arbiter counts, in Kubernetes shape.

Read by services.migration (arbitration, spec §4) and `koordbus calc arbitrate`; written back by the Kubernetes
bridge. Field names follow the CRD (scheduling.koordinator.sh_podmigrationjobs.yaml in
../shared/reference/koordinator-crds/); only what koordbus reads or writes is typed, the rest is ignored on decode.
"""

from __future__ import annotations

import datetime as dt
from typing import Final, Literal

import msgspec

from schemas import kube

API_VERSION: Final = "scheduling.koordinator.sh/v1alpha1"
KIND: Final = "PodMigrationJob"
ANNOTATION_PASSED_ARBITRATION: Final = "descheduler.koordinator.sh/passed-arbitration"
ANNOTATION_EVICT: Final = "descheduler.alpha.kubernetes.io/evict"
"""On a pod: skip every evictability filter (the descheduler's explicit opt-in)."""
ANNOTATION_EVICTION_COST: Final = "scheduling.koordinator.sh/eviction-cost"
ANNOTATION_DELETION_COST: Final = "controller.kubernetes.io/pod-deletion-cost"

Phase = Literal["", "Pending", "Running", "Succeeded", "Failed", "Aborted"]
PHASE_PENDING: Final = "Pending"
PHASE_RUNNING: Final = "Running"
PHASE_SUCCEEDED: Final = "Succeeded"
PHASE_FAILED: Final = "Failed"
PHASE_ABORTED: Final = "Aborted"
TERMINAL_PHASES: Final = frozenset({PHASE_SUCCEEDED, PHASE_FAILED, PHASE_ABORTED})

MODE_RESERVATION_FIRST: Final = "ReservationFirst"
MODE_EVICT_DIRECTLY: Final = "EvictDirectly"

REASON_FORBIDDEN: Final = "ForbiddenMigratePod"
REASON_MISSING_POD: Final = "MissingPod"
REASON_INVALID_POD_REF: Final = "InvalidPodRef"
REASON_TIMEOUT: Final = "Timeout"


class ObjectReference(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    api_version: str = ""
    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str = ""


class PodMigrationJobSpec(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    paused: bool = False
    ttl: str | None = None
    """A Go duration ("5m0s")."""
    mode: str = ""
    pod_ref: ObjectReference | None = None
    reservation_options: dict[str, object] | None = None
    delete_options: dict[str, object] | None = None


class Condition(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    type: str
    status: str
    reason: str = ""
    message: str = ""
    last_probe_time: dt.datetime | None = None
    last_transition_time: dt.datetime | None = None


class PodMigrationJobStatus(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    phase: str = ""
    status: str = ""
    reason: str = ""
    message: str = ""
    conditions: list[Condition] = []
    node_name: str = ""
    pod_ref: ObjectReference | None = None


class PodMigrationJob(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    api_version: str = API_VERSION
    kind: str = KIND
    metadata: kube.ObjectMeta = kube.ObjectMeta()
    spec: PodMigrationJobSpec = PodMigrationJobSpec()
    status: PodMigrationJobStatus = PodMigrationJobStatus()


def phase_of(job: PodMigrationJob) -> str:
    """The job's phase, "" read as Pending."""
    return job.status.phase or PHASE_PENDING


def passed_arbitration(job: PodMigrationJob) -> bool:
    return job.metadata.annotations.get(ANNOTATION_PASSED_ARBITRATION) == "true"


def is_active(job: PodMigrationJob) -> bool:
    """Pending or Running (what the limits count, before the arbitration subtleties)."""
    return phase_of(job) in (PHASE_PENDING, PHASE_RUNNING)


def is_waiting(job: PodMigrationJob) -> bool:
    """Waiting for arbitration: Pending (or unset) and not yet passed."""
    return phase_of(job) == PHASE_PENDING and not passed_arbitration(job) and not job.spec.paused


def is_migrating(job: PodMigrationJob) -> bool:
    """Counted by the limits during arbitration: Running, or Pending and already passed."""
    phase = phase_of(job)
    return phase == PHASE_RUNNING or (phase == PHASE_PENDING and passed_arbitration(job))


class Workload(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """A pod controller the arbiter counts: its expected replicas (spec.replicas)."""

    api_version: str = ""
    kind: str = ""
    namespace: str = ""
    name: str = ""
    uid: str
    replicas: int
