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

A view lives for many rounds (the service's lives until pods, workloads or nodes change), and most jobs are the same
objects from one round to the next (jobs are immutable: a changed job is another object). So what a round reads of a
job — its facts, whether it is migrating or waiting, its place in the order, its static verdict — is worked out the
first round that job object is seen and kept on the view (`ClusterView.entry`): a later round is one pass over the
jobs, one sort of kept keys and the limits. tests/unit/test_migration_arbiter_rounds.py holds rounds over a kept
view to a round computed afresh.
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

import msgspec

from schemas import kube, migration
from schemas.scheduling import SchedulingNode, SchedulingPod
from services.migration import filters, order
from services.migration import lownodeload_balance as balance
from services.migration.args import MigrationArgs
from services.migration.lownodeload_round import scheduling_node, scheduling_pod


class Decision(msgspec.Struct, frozen=True, gc=False):
    """A struct rather than a frozen dataclass: a round makes one per waiting job, and this one is built ten times
    faster. Not tracked by the garbage collector (it holds only strings: no cycle), so thousands of them made in a
    round do not set off collections."""

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


MIGRATING: Final = 0
WAITING: Final = 1
OTHER: Final = 2


class JobEntry(msgspec.Struct, frozen=True, gc=False):
    """One job object as a round reads it through a view (ClusterView.entry). A struct, untracked by the garbage
    collector (nothing it holds refers back to it): the first round over a view makes one per job, with positional
    arguments (five times faster than keywords for these many fields)."""

    job: migration.PodMigrationJob
    """The very object this was worked out for: a job seen again as another object is worked out again."""
    name: str
    kind: int
    """MIGRATING (Running, or Pending and passed), WAITING (Pending, not passed, not paused) or OTHER."""
    pod: kube.Pod | None
    """Its pod in the view (None: not there)."""
    key: str
    """The pod's key (namespace/name; from the reference without a pod)."""
    owner: kube.OwnerReference | None
    """The pod's controller."""
    namespace: str
    """Its pod reference's namespace ("" without one)."""
    batch_owner: str | None
    """The uid of the batch Job controlling its pod (order.batch_job_owner)."""
    order_key: tuple[int, float]
    """(the rank of its pod's sort key in the view, -1 without a pod; minus its creation seconds): order.arrange's
    key."""
    static: Decision | None = None
    """A waiting job's decision by ClusterView.static_verdict, if that holds it."""
    evict: bool = False
    """Its pod has the evict annotation (no retryable limit holds it)."""
    node: str = ""
    pod_namespace: str = ""
    owner_uid: str | None = None
    workload: filters.WorkloadView | None = None
    owner_known: bool = True
    """With key, node, pod_namespace, owner_uid and workload: what the retryable limits read of a waiting job's pod
    (a filters.Held)."""
    gone: tuple[str, str] | None = None
    """(controller uid, pod key) of a Succeeded job whose pod the view still shows (evicted_but_still_seen)."""


_ORDER_KEY: Final = operator.attrgetter("order_key")
_BATCH_OWNER: Final = operator.attrgetter("batch_owner")


@dataclass
class Memo:
    """What a view keeps from round to round for one args object (ClusterView.memo)."""

    args: MigrationArgs
    limits: filters.Limits
    """The retryable limits of `args`, with the verdicts they have given."""
    static: dict[str, tuple[str, filters.Verdict] | None] = field(default_factory=dict)
    """pod key → static_verdict's answer."""
    entries: dict[str, JobEntry] = field(default_factory=dict)
    """job name → the entry of the job object last seen under that name."""
    held: dict[str, tuple[filters.Verdict, Decision]] = field(default_factory=dict)
    """job name → the last verdict that held it back and the decision saying so."""
    ordered: tuple[list[JobEntry], dict[str, int], list[JobEntry]] = field(default_factory=lambda: ([], {}, []))
    """The last round's waiting entries, migrating pods per batch Job, and their order (order.arrange)."""

    def arrange(self, waiting: list[JobEntry], in_batch_job: dict[str, int]) -> list[JobEntry]:
        """order.arrange of the waiting entries; the last round's order again when they are the same entries in
        the same order with the same batch Job counts (a round that passed nothing)."""
        last, last_in_batch_job, last_order = self.ordered
        if len(last) == len(waiting) and all(map(operator.is_, last, waiting)) and last_in_batch_job == in_batch_job:
            return last_order
        arranged = order.arrange(waiting, key=_ORDER_KEY, batch_owner=_BATCH_OWNER, migrating_in_job=in_batch_job)
        self.ordered = (waiting, in_batch_job, arranged)
        return arranged


@dataclass
class ClusterView:
    """The pods and workloads as the arbiter reads them, indexed once: the migration service keeps one up to date
    from pod events between rounds; `koordbus calc arbitrate` builds one per call."""

    by_key: dict[str, kube.Pod]
    by_uid: dict[str, kube.Pod]
    owners: dict[str, kube.OwnerReference | None]
    """pod key → its controller reference."""
    ranks: dict[str, int]
    """pod key → the rank of its PodSorter key (order.pod_sort_key) among the view's pods' (equal keys, equal
    ranks): a round sorts by these, cheaper to compare than the keys."""
    workloads: dict[str, migration.Workload]
    views: dict[str, filters.WorkloadView]
    nodes: list[SchedulingNode] = field(default_factory=list)
    """The nodes nodeFit tries (in name order); empty when the caller gave none."""
    pods_on: dict[str, list[SchedulingPod]] = field(default_factory=dict)
    _memo: Memo | None = field(default=None, repr=False, compare=False)

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
        sort_keys = {key: order.pod_sort_key(p) for key, p in by_key.items()}
        rank = {sort_key: index for index, sort_key in enumerate(sorted(set(sort_keys.values())))}
        return cls(
            nodes=[scheduling_node(n) for n in sorted(nodes, key=lambda n: n.metadata.name)] if fitting else [],
            pods_on=balance.pods_by_node([scheduling_pod(p) for p in by_key.values()]) if fitting else {},
            by_key=by_key,
            by_uid={p.metadata.uid: p for p in by_key.values() if p.metadata.uid},
            owners={key: kube.controller_of(p.metadata) for key, p in by_key.items()},
            ranks={key: rank[sort_key] for key, sort_key in sort_keys.items()},
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
        static = self.memo(args).static
        if key in static:
            return static[key]
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
        static[key] = answer
        return answer

    def memo(self, args: MigrationArgs) -> Memo:
        """What this view keeps between rounds for `args` (started afresh when another args object comes)."""
        memo = self._memo
        if memo is None or memo.args is not args:
            memo = self._memo = Memo(args=args, limits=filters.Limits.of(args))
        return memo

    def entry(self, job: migration.PodMigrationJob, args: MigrationArgs) -> JobEntry:
        """The job's entry, worked out once per job object (and args) for the view's life."""
        entries = self.memo(args).entries
        name = job.metadata.name
        kept = entries.get(name)
        if kept is not None and kept.job is job:
            return kept
        pod = self.pod_of(job)
        key = kube.pod_key(pod) if pod is not None else _pod_key(job)
        owner = self.owners.get(key) if pod is not None else None
        ref = job.spec.pod_ref
        static: Decision | None = None
        workload: filters.WorkloadView | None = None
        owner_known, evict = True, False
        node = pod_namespace = ""
        seen: tuple[str, str] | None = None
        phase = job.status.phase or migration.PHASE_PENDING
        if phase == migration.PHASE_RUNNING or (phase == migration.PHASE_PENDING and migration.passed_arbitration(job)):
            kind = MIGRATING
        elif phase == migration.PHASE_PENDING and not job.spec.paused:
            kind = WAITING
            if pod is not None:
                if (verdict := self.static_verdict(key, args)) is not None:
                    static = Decision(name, verdict[0], verdict[1].filter, verdict[1].message)
                node, pod_namespace, evict = pod.spec.node_name, pod.metadata.namespace, filters.evict_annotation(pod)
            workload = self.views.get(owner.uid) if owner is not None else None
            owner_known = owner is None or owner.uid in self.workloads
        else:
            kind = OTHER
            gone = self.evicted_but_still_seen(job)
            if gone is not None and (gone_owner := self.owners.get(kube.pod_key(gone))) is not None:
                seen = (gone_owner.uid, kube.pod_key(gone))
        made = entries[name] = JobEntry(
            job,
            name,
            kind,
            pod,
            key,
            owner,
            ref.namespace if ref is not None else "",  # namespace
            order.batch_job_owner(owner),
            (self.ranks[key] if pod is not None else -1, -order.creation_seconds(job.metadata)),  # order_key
            static,
            evict,
            node,
            pod_namespace,
            owner.uid if owner is not None else None,  # owner_uid
            workload,
            owner_known,
            seen,  # gone
        )
        return made

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
    memo = view.memo(args)
    entries, limits, held = memo.entries, memo.limits, memo.held
    migrating = filters.Migrating()
    in_batch_job: dict[str, int] = {}
    waiting: list[JobEntry] = []
    for job in jobs:
        entry = entries.get(job.metadata.name)
        if entry is None or entry.job is not job:  # (view.entry's own check, spared a call for most jobs)
            entry = view.entry(job, args)
        kind = entry.kind
        if kind == WAITING:
            waiting.append(entry)
        elif kind == MIGRATING:
            migrating.add(entry.key, entry.pod, entry.namespace, owner=entry.owner)
            if (batch_owner := entry.batch_owner) is not None:
                in_batch_job[batch_owner] = in_batch_job.get(batch_owner, 0) + 1
        elif entry.gone is not None:
            uid, key = entry.gone
            migrating.by_workload.setdefault(uid, set()).add(key)
    result = Round()
    names, decisions = result.order, result.decisions
    for entry in memo.arrange(waiting, in_batch_job):
        name = entry.name
        names.append(name)
        pod = entry.pod
        if pod is None:
            decisions.append(Decision(name, "passed", message="pod not found: the reconcile fails it"))
            migrating.add(entry.key, None, entry.namespace, owner=None)
            continue
        if entry.static is not None:
            decisions.append(entry.static)
            continue
        verdict = None if entry.evict else limits.hold(migrating, entry)
        if verdict is not None:
            told = held.get(name)
            if told is None or told[0] is not verdict:
                told = held[name] = (verdict, Decision(name, "waiting", verdict.filter, verdict.message))
            decisions.append(told[1])
            continue
        decisions.append(Decision(name, "passed"))
        migrating.add(entry.key, pod, pod.metadata.namespace, owner=entry.owner)
    return result
