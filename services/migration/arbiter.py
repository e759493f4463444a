"""One arbitration round (spec §4.4): which waiting PodMigrationJobs pass, fail or wait, and why. Pure.

`arbitrate(jobs, pods, workloads, args)` takes every job the cluster holds, the pods and the workloads (expected
replicas); jobs Running, or Pending with the passed-arbitration annotation, are migrating and count toward the
limits. The waiting jobs (Pending, not passed, not paused) are ordered (services.migration.order) and filtered one
by one (services.migration.filters): a non-retryable failure fails the job (ForbiddenMigratePod), a retryable one
leaves it waiting with the filter that held it, and a pass (or a missing pod: the reconcile then fails it with
MissingPod) makes it migrating at once, so it counts against the jobs after it in the same round. So no round ever
passes more than a limit allows. Called by `koordbus calc arbitrate`, the migration service and bench/arbitration.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas import kube, migration
from services.migration import filters, order
from services.migration.args import MigrationArgs


@dataclass(frozen=True, slots=True)
class Decision:
    job: str
    outcome: str
    """passed | failed | waiting"""
    filter: str = ""
    message: str = ""


@dataclass
class Round:
    order: list[str] = field(default_factory=list)
    """The waiting jobs in the order they were considered."""
    decisions: list[Decision] = field(default_factory=list)

    def names(self, outcome: str) -> list[str]:
        return [d.job for d in self.decisions if d.outcome == outcome]


def _pod_key(job: migration.PodMigrationJob) -> str:
    ref = job.spec.pod_ref
    return f"{ref.namespace}/{ref.name}" if ref is not None else ""


def arbitrate(
    jobs: Iterable[migration.PodMigrationJob],
    pods: Iterable[kube.Pod],
    workloads: Iterable[migration.Workload],
    args: MigrationArgs,
) -> Round:
    jobs = list(jobs)
    by_key = {kube.pod_key(p): p for p in pods}
    by_uid = {p.metadata.uid: p for p in by_key.values() if p.metadata.uid}
    known = {w.uid: w for w in workloads}
    views = filters.workload_views(known, by_key)

    def pod_of(job: migration.PodMigrationJob) -> kube.Pod | None:
        ref = job.spec.pod_ref
        if ref is None:
            return None
        if ref.uid and ref.uid in by_uid:
            return by_uid[ref.uid]
        return by_key.get(_pod_key(job))

    migrating = filters.Migrating()
    in_batch_job: dict[str, int] = {}
    for job in jobs:
        if migration.is_migrating(job):
            pod = pod_of(job)
            ref = job.spec.pod_ref
            migrating.add(_pod_key(job), pod, ref.namespace if ref is not None else "")
            batch_owner = order.batch_job_owner(pod)
            if batch_owner is not None:
                in_batch_job[batch_owner] = in_batch_job.get(batch_owner, 0) + 1
    waiting = [job for job in jobs if migration.is_waiting(job)]
    result = Round()
    for job in order.sort_jobs(waiting, pod_of, in_batch_job):
        name = job.metadata.name
        result.order.append(name)
        pod = pod_of(job)
        if pod is None:
            result.decisions.append(Decision(name, "passed", message="pod not found: the reconcile fails it"))
            migrating.add(_pod_key(job), None, job.spec.pod_ref.namespace if job.spec.pod_ref else "")
            continue
        owner = kube.controller_of(pod.metadata)
        view = views.get(owner.uid) if owner is not None else None
        owner_known = owner is None or owner.uid in known
        verdict = filters.non_retryable(pod, args, view, owner_known=owner_known)
        if verdict is not None:
            result.decisions.append(Decision(name, "failed", verdict.filter, verdict.message))
            continue
        verdict = filters.retryable(pod, args, migrating, view, owner_known=owner_known)
        if verdict is not None:
            result.decisions.append(Decision(name, "waiting", verdict.filter, verdict.message))
            continue
        result.decisions.append(Decision(name, "passed"))
        migrating.add(kube.pod_key(pod), pod, pod.metadata.namespace)
    return result
