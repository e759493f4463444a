"""One arbitration round (spec §4.4): which waiting PodMigrationJobs pass, fail or wait, and why. Pure.

`arbitrate(jobs, view, args)` takes every job the cluster holds and a ClusterView of the pods and workloads (their
expected replicas); `arbitrate_objects` builds the view first. Jobs Running, or Pending with the passed-arbitration
annotation, are migrating and count toward the limits. The waiting jobs (Pending, not passed, not paused) are
ordered (services.migration.order) and filtered one by one (services.migration.filters): a non-retryable failure
(with args.nodeFit, a pod that fits no other node of the view's among them; while the view has no nodes at all the
job waits instead, a deliberate difference from Koordinator, whose empty node list fails it) fails the job
(ForbiddenMigratePod), a retryable one leaves it waiting with the filter that held it, and a pass (or
a missing pod: the reconcile then fails it with MissingPod) makes it migrating at once, so it counts against the
jobs after it in the same round. So no round ever passes more than a limit allows. Called by `koordbus calc
arbitrate`, the migration service and bench/arbitration.py.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from schemas import kube, migration
from schemas.scheduling import SchedulingNode, SchedulingPod
from services.migration import filters, order
from services.migration import lownodeload_balance as balance
from services.migration.args import MigrationArgs
from services.migration.lownodeload_round import scheduling_node, scheduling_pod


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


@dataclass(frozen=True, slots=True)
class JobFacts:
    """What a round reads of a job through the view: its pod (None: not in the view), the pod's key, its controller
    and its sort key (None with no pod)."""

    pod: kube.Pod | None
    key: str
    owner: kube.OwnerReference | None
    sort_key: order.PodKey | None


@dataclass
class ClusterView:
    """The pods and workloads as the arbiter reads them, indexed once: the migration service keeps one up to date
    from pod events between rounds; `koordbus calc arbitrate` builds one per call."""

    by_key: dict[str, kube.Pod]
    by_uid: dict[str, kube.Pod]
    owners: dict[str, kube.OwnerReference | None]
    """pod key → its controller reference."""
    sort_keys: dict[str, order.PodKey]
    workloads: dict[str, migration.Workload]
    views: dict[str, filters.WorkloadView]
    nodes: list[SchedulingNode] = field(default_factory=list)
    """The nodes nodeFit tries (in name order); empty when the caller gave none."""
    pods_on: dict[str, list[SchedulingPod]] = field(default_factory=dict)
    _static: dict[str, tuple[str, filters.Verdict] | None] = field(default_factory=dict, repr=False, compare=False)
    """pod key → static_verdict's answer, for the view's life."""
    _static_args: MigrationArgs | None = field(default=None, repr=False, compare=False)
    _facts: dict[tuple[str, ...], JobFacts] = field(default_factory=dict, repr=False, compare=False)
    """(job name, pod reference) → job_facts' answer, for the view's life."""

    @classmethod
    def build(
        cls,
        pods: Iterable[kube.Pod],
        workloads: Iterable[migration.Workload],
        args: MigrationArgs,
        *,
        nodes: Iterable[kube.Node] = (),
    ) -> ClusterView:
        by_key = {kube.pod_key(p): p for p in pods}
        known = {w.uid: w for w in workloads}
        fitting = args.node_fit and args.gate_on("NodeFit")
        return cls(
            nodes=[scheduling_node(n) for n in sorted(nodes, key=lambda n: n.metadata.name)] if fitting else [],
            pods_on=balance.pods_by_node([scheduling_pod(p) for p in by_key.values()]) if fitting else {},
            by_key=by_key,
            by_uid={p.metadata.uid: p for p in by_key.values() if p.metadata.uid},
            owners={key: kube.controller_of(p.metadata) for key, p in by_key.items()},
            sort_keys={key: order.pod_sort_key(p) for key, p in by_key.items()},
            workloads=known,
            views=filters.workload_views(known, by_key, args),
        )

    def evicted_but_still_seen(self, job: migration.PodMigrationJob) -> kube.Pod | None:
        """The pod of a Succeeded (not dry-run) job when the view still shows that very pod (same uid) active.

        The eviction is done but our view of the pods lags behind it: counted as unavailable for its workload, or a
        burst could evict more pods than maxUnavailable allows before the deletion (and the replacement) is seen.
        Koordinator counts from its informer cache and has this window; we close it deliberately.
        """
        status, ref = job.status, job.spec.pod_ref
        if status.phase != migration.PHASE_SUCCEEDED or status.reason == "DryRun":
            return None
        if ref is None or not ref.uid:
            return None
        pod = self.by_uid.get(ref.uid)
        return pod if pod is not None and filters.active(pod) else None

    def static_verdict(self, key: str, args: MigrationArgs) -> tuple[str, filters.Verdict] | None:
        """(outcome, verdict) of the filters that read only the pod of `key`, its workload, the view's nodes and the
        args: the non-retryable ones ("failed"), then nodeFit ("failed", or "waiting" while the view knows no node
        yet); None when they all pass. None of that changes for the view's life (the service rebuilds the view when
        pods, workloads or nodes change), so it is worked out once per pod and view: most of a round's cost when
        thousands of jobs wait round after round."""
        if self._static_args is not args:
            self._static.clear()
            self._static_args = args
        if key in self._static:
            return self._static[key]
        pod = self.by_key[key]
        owner = self.owners.get(key)
        workload = self.views.get(owner.uid) if owner is not None else None
        owner_known = owner is None or owner.uid in self.workloads
        answer: tuple[str, filters.Verdict] | None = None
        verdict = filters.non_retryable(pod, args, workload, owner=owner, owner_known=owner_known)
        if verdict is not None:
            answer = ("failed", verdict)
        elif args.node_fit and args.gate_on("NodeFit") and not filters.evict_annotation(pod):
            if not self.nodes:  # not seen yet (a service just started): wait rather than fail
                answer = ("waiting", filters.Verdict("NodeFit", "no nodes known to fit the pod on yet"))
            elif (verdict := filters.fits_elsewhere(pod, self.nodes, self.pods_on)) is not None:
                answer = ("failed", verdict)
        self._static[key] = answer
        return answer

    def job_facts(self, job: migration.PodMigrationJob) -> JobFacts:
        """The job's pod, key, controller and sort key in this view; looked up once per job reference and view."""
        ref = job.spec.pod_ref
        cache_key = (job.metadata.name, ref.namespace, ref.name, ref.uid) if ref is not None else (job.metadata.name,)
        facts = self._facts.get(cache_key)
        if facts is None:
            pod = self.pod_of(job)
            if pod is None:
                facts = JobFacts(pod=None, key=_pod_key(job), owner=None, sort_key=None)
            else:
                key = kube.pod_key(pod)
                facts = JobFacts(pod=pod, key=key, owner=self.owners.get(key), sort_key=self.sort_keys.get(key))
            self._facts[cache_key] = facts
        return facts

    def pod_of(self, job: migration.PodMigrationJob) -> kube.Pod | None:
        ref = job.spec.pod_ref
        if ref is None:
            return None
        if ref.uid and ref.uid in self.by_uid:
            return self.by_uid[ref.uid]
        return self.by_key.get(f"{ref.namespace}/{ref.name}")


def arbitrate_objects(
    jobs: Iterable[migration.PodMigrationJob],
    pods: Iterable[kube.Pod],
    workloads: Iterable[migration.Workload],
    args: MigrationArgs,
) -> Round:
    """One round over objects as given (the view built for this round only)."""
    return arbitrate(jobs, ClusterView.build(pods, workloads, args), args)


def arbitrate(jobs: Iterable[migration.PodMigrationJob], view: ClusterView, args: MigrationArgs) -> Round:
    jobs = list(jobs)
    facts = {job.metadata.name: view.job_facts(job) for job in jobs}
    migrating = filters.Migrating()
    in_batch_job: dict[str, int] = {}
    waiting: list[migration.PodMigrationJob] = []
    for job in jobs:  # is_migrating / is_waiting, the phase read once
        phase = job.status.phase or migration.PHASE_PENDING
        passed = migration.passed_arbitration(job)
        if phase == migration.PHASE_RUNNING or (phase == migration.PHASE_PENDING and passed):
            fact = facts[job.metadata.name]
            ref = job.spec.pod_ref
            migrating.add(fact.key, fact.pod, ref.namespace if ref else "", owner=fact.owner)
            batch_owner = order.batch_job_owner(fact.owner)
            if batch_owner is not None:
                in_batch_job[batch_owner] = in_batch_job.get(batch_owner, 0) + 1
            continue
        if phase == migration.PHASE_PENDING and not job.spec.paused:
            waiting.append(job)
        elif (gone := view.evicted_but_still_seen(job)) is not None:
            owner = view.owners.get(kube.pod_key(gone))
            if owner is not None:
                migrating.by_workload.setdefault(owner.uid, set()).add(kube.pod_key(gone))
    names = [job.metadata.name for job in waiting]
    batch_owners = {name: order.batch_job_owner(facts[name].owner) for name in names}
    sort_keys = {name: facts[name].sort_key for name in names}
    result = Round()
    for job in order.sort_jobs(waiting, sort_keys, batch_owners, in_batch_job):
        name = job.metadata.name
        result.order.append(name)
        fact = facts[name]
        pod, owner, key = fact.pod, fact.owner, fact.key
        if pod is None:
            result.decisions.append(Decision(name, "passed", message="pod not found: the reconcile fails it"))
            ref = job.spec.pod_ref
            migrating.add(key, None, ref.namespace if ref else "", owner=None)
            continue
        static = view.static_verdict(key, args)
        if static is not None:
            outcome, held = static
            result.decisions.append(Decision(name, outcome, held.filter, held.message))
            continue
        workload = view.views.get(owner.uid) if owner is not None else None
        owner_known = owner is None or owner.uid in view.workloads
        verdict = filters.retryable(pod, args, migrating, workload, owner=owner, owner_known=owner_known, key=key)
        if verdict is not None:
            result.decisions.append(Decision(name, "waiting", verdict.filter, verdict.message))
            continue
        result.decisions.append(Decision(name, "passed"))
        migrating.add(key, pod, pod.metadata.namespace, owner=owner)
    return result
