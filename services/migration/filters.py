"""The arbitration filters of spec §4.5: pure.

`non_retryable` says why a pod may never be migrated (its job then fails with ForbiddenMigratePod): the
eviction-cost veto, the standard descheduler evictability rules (bare, DaemonSet, mirror and terminating pods,
system-critical pods, local storage, PVCs, the priority threshold, the label selector, the namespaces) and the
expected-replicas rule. `Migrating` is the arbiter's running count of what is migrating (jobs Running, or Pending
and already passed), by node, namespace and workload; `retryable` says which limit holds a pod back for now (its
job waits for the next round): global, per node, per namespace, per workload migrating and per workload
unavailable. A pod with the `descheduler.alpha.kubernetes.io/evict` annotation skips both. Each answer is None
(pass) or a `Verdict` naming the filter and the numbers. With `nodeFit`, `fits_elsewhere` is the standard
evictor's NodeFit (Koordinator's PodFitsAnyOtherNode): the pod must fit some other node, by the same pure check
the LowNodeLoad round uses (services.migration.lownodeload_util.node_fit: node selector and required affinity,
taints, requests against allocatable less the node's pods' requests, a schedulable node).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Protocol

import msgspec

from schemas import kube, migration
from schemas.scheduling import SchedulingNode, SchedulingPod
from schemas.selectors import selector_matches
from services.migration import lownodeload_util
from services.migration.args import MigrationArgs, Namespaces, get_max_unavailable
from services.migration.lownodeload_round import scheduling_pod

MAX_INT32: Final = 2**31 - 1
SYSTEM_CRITICAL_PRIORITY: Final = 2_000_000_000
SYSTEM_CRITICAL_CLASSES: Final = frozenset({"system-cluster-critical", "system-node-critical"})
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
_NONE: Final[frozenset[str]] = frozenset()


class Verdict(msgspec.Struct, frozen=True, gc=False):
    """A struct rather than a frozen dataclass, built ten times faster; holding only strings, it is left out of the
    garbage collector's tracking."""

    filter: str
    """The gate / filter that said no (e.g. MaxMigratingPerNode)."""
    message: str


@dataclass(frozen=True, slots=True)
class WorkloadView:
    """One workload as the filters read it."""

    uid: str
    replicas: int
    unready: frozenset[str]
    """Keys of its pods that are not both active and Ready."""
    max_migrating: int
    max_unavailable: int
    """maxMigratingPerWorkload / maxUnavailablePerWorkload scaled by its replicas (GetMaxUnavailable)."""


def evict_annotation(pod: kube.Pod) -> bool:
    return migration.ANNOTATION_EVICT in pod.metadata.annotations


def _volumes(pod: kube.Pod) -> tuple[bool, bool]:
    """(has local storage: emptyDir or hostPath, has a PVC)."""
    local = pvc = False
    for volume in pod.spec.volumes or ():
        local = local or volume.empty_dir is not None or volume.host_path is not None
        pvc = pvc or volume.persistent_volume_claim is not None
    return local, pvc


def non_retryable(
    pod: kube.Pod,
    args: MigrationArgs,
    workload: WorkloadView | None,
    *,
    owner: kube.OwnerReference | None,
    owner_known: bool,
) -> Verdict | None:
    """Why the pod may never migrate, or None. `owner` is its controller reference (kube.controller_of, computed
    once by the caller), `workload` that controller's view (None when it has none, or when the controller is
    unknown: then `owner_known` is False)."""
    verdict = evictable(pod, args)
    if verdict is not None or evict_annotation(pod):
        return verdict
    if owner is not None and args.gate_on("ExpectedReplicas"):
        if not owner_known or workload is None:
            return Verdict("ExpectedReplicas", f"the workload controlling pod {kube.pod_key(pod)} cannot be read")
        if not args.skip_check_expected_replicas:
            replicas, max_migrating, max_unavailable = (
                workload.replicas,
                workload.max_migrating,
                workload.max_unavailable,
            )
            if replicas in (1, max_migrating, max_unavailable):
                return Verdict(
                    "ExpectedReplicas",
                    f"workload {workload.uid} expects {replicas} replica(s), equal to 1, maxMigrating "
                    f"{max_migrating} or maxUnavailable {max_unavailable}: migrating would take it all down",
                )
    return None


def evictable(pod: kube.Pod, args: MigrationArgs) -> Verdict | None:
    """Why the pod itself may never be evicted (eviction cost, the standard evictability rules), or None; the
    expected-replicas rule, which needs the workload, is non_retryable's."""
    if evict_annotation(pod):
        return None
    try:
        cost = int(pod.metadata.annotations.get(migration.ANNOTATION_EVICTION_COST, "0"))
    except ValueError:
        cost = 0
    if cost == MAX_INT32:
        return Verdict("EvictionCost", f"pod {kube.pod_key(pod)} has eviction cost MaxInt32 (never evict)")
    return _evictability(pod, args)


def _evictability(pod: kube.Pod, args: MigrationArgs) -> Verdict | None:
    # Most pods pass every rule: each test puts the pod's own condition before the gate and formats the pod's key
    # only for a message.
    meta = pod.metadata
    owners = meta.owner_references
    if meta.deletion_timestamp is not None:
        return Verdict("Terminating", f"pod {kube.pod_key(pod)} is already terminating")
    if MIRROR_ANNOTATION in meta.annotations:
        return Verdict("MirrorPod", f"pod {kube.pod_key(pod)} is a mirror (static) pod")
    for ref in owners:
        if ref.kind == "DaemonSet":
            return Verdict("DaemonSet", f"pod {kube.pod_key(pod)} belongs to a DaemonSet")
    if not owners and args.gate_on("BarePods"):
        allowed = args.evict_all_bare_pods or (args.evict_failed_bare_pods and pod.status.phase == "Failed")
        if not allowed:
            return Verdict("BarePods", f"pod {kube.pod_key(pod)} has no owner (evictAllBarePods is off)")
    priority = pod.spec.priority or 0
    critical = priority >= SYSTEM_CRITICAL_PRIORITY or pod.spec.priority_class_name in SYSTEM_CRITICAL_CLASSES
    if critical and not args.evict_system_critical_pods and args.gate_on("SystemCritical"):
        return Verdict("SystemCritical", f"pod {kube.pod_key(pod)} is system-critical")
    local, pvc = _volumes(pod)
    if local and not args.evict_local_storage_pods and args.gate_on("LocalStorage"):
        return Verdict("LocalStorage", f"pod {kube.pod_key(pod)} uses local storage (emptyDir or hostPath)")
    if pvc and args.ignore_pvc_pods and args.gate_on("PVC"):
        return Verdict("PVC", f"pod {kube.pod_key(pod)} uses a PersistentVolumeClaim (ignorePvcPods is on)")
    threshold = args.priority_threshold.value if args.priority_threshold is not None else None
    if threshold is not None and priority >= threshold and args.gate_on("PriorityThreshold"):
        return Verdict("PriorityThreshold", f"pod {kube.pod_key(pod)} priority {priority} ≥ threshold {threshold}")
    selector = args.label_selector
    if selector is not None and args.gate_on("LabelSelector") and not selector_matches(selector, meta.labels):
        return Verdict("LabelSelector", f"pod {kube.pod_key(pod)} does not match the label selector")
    spaces = args.namespaces
    if spaces is not None and args.gate_on("Namespaces") and not _namespace_selected(meta.namespace, spaces):
        return Verdict("Namespaces", f"pod {kube.pod_key(pod)}'s namespace {meta.namespace} is not selected")
    return None


def _namespace_selected(namespace: str, spaces: Namespaces) -> bool:
    return (not spaces.include or namespace in spaces.include) and namespace not in spaces.exclude


@dataclass
class Migrating:
    """What is migrating (jobs Running, or Pending that passed arbitration), as the retryable filters count it."""

    total: int = 0
    by_node: dict[str, set[str]] = field(default_factory=dict)
    """node → keys of the pods migrating from it."""
    by_namespace: dict[str, int] = field(default_factory=dict)
    by_workload: dict[str, set[str]] = field(default_factory=dict)
    """controller uid → keys of its pods migrating."""
    pods: set[str] = field(default_factory=set)
    """Keys (namespace/name) of every pod with a migrating job."""
    jobs_of: dict[str, int] = field(default_factory=dict)
    """Pod key → how many of the counted jobs are that pod's (they count against no limit of the pod itself)."""

    def add(self, key: str, pod: kube.Pod | None, namespace: str, *, owner: kube.OwnerReference | None) -> None:
        self.total += 1
        self.pods.add(key)
        self.jobs_of[key] = self.jobs_of.get(key, 0) + 1
        self.by_namespace[namespace] = self.by_namespace.get(namespace, 0) + 1
        if pod is not None and pod.spec.node_name:
            self.by_node.setdefault(pod.spec.node_name, set()).add(key)
        if owner is not None:
            self.by_workload.setdefault(owner.uid, set()).add(key)


def retryable(
    pod: kube.Pod,
    args: MigrationArgs,
    migrating: Migrating,
    workload: WorkloadView | None,
    *,
    owner: kube.OwnerReference | None,
    owner_known: bool,
    key: str | None = None,
) -> Verdict | None:
    """Which limit holds the pod back now, or None. The job under arbitration is not among `migrating` yet, and
    the pod's other jobs there count against none of its limits (spec §4.5). `key`: the pod's, if the caller has
    it at hand. A round checks many pods against the same args: it takes `Limits.of(args)` once instead."""
    if evict_annotation(pod):
        return None
    facts = PodFacts(
        key=key or kube.pod_key(pod),
        node=pod.spec.node_name,
        pod_namespace=pod.metadata.namespace,
        owner_uid=owner.uid if owner is not None else None,
        workload=workload,
        owner_known=owner_known,
    )
    return Limits.of(args).hold(migrating, facts)


class Held(Protocol):
    """What the retryable limits read of a pod: its key, node, namespace, controller's uid (None: it has none),
    that controller's view and whether the controller is known. The arbiter keeps these per job
    (arbiter.JobEntry), so a round reads no pod."""

    @property
    def key(self) -> str: ...
    @property
    def node(self) -> str: ...
    @property
    def pod_namespace(self) -> str: ...
    @property
    def owner_uid(self) -> str | None: ...
    @property
    def workload(self) -> WorkloadView | None: ...
    @property
    def owner_known(self) -> bool: ...


class PodFacts(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A Held read off one pod (retryable's)."""

    key: str
    node: str
    pod_namespace: str
    owner_uid: str | None
    workload: WorkloadView | None
    owner_known: bool


MESSAGES: Final = {
    "MaxMigratingGlobally": "{count} pods migrating, the global limit is {limit}",
    "MaxMigratingPerNode": "{count} pods migrating from node {subject}, the limit is {limit}",
    "MaxMigratingPerNamespace": "{count} pods migrating in namespace {subject}, the limit is {limit}",
    "Workload": "the workload controlling pod {subject} cannot be read",
    "MaxMigratingPerWorkload": "{count} pods of workload {subject} migrating, maxMigrating is {limit}",
    "MaxUnavailablePerWorkload": (
        "{count} pods of workload {subject} unavailable or migrating, maxUnavailable is {limit}"
    ),
}
"""The retryable filters' messages: `subject` is the node, namespace, workload uid or pod key."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The retryable limits of some args with their gates applied (0: no limit, False: gate skipped), read once
    per round rather than once per pod. It keeps the verdicts it has given (one per filter, subject and numbers):
    a round holds back thousands of pods, mostly with a verdict given before, and building the message was most of
    the cost of holding one."""

    globally: int
    per_node: int
    per_namespace: int
    per_workload: bool
    """The MaxMigratingPerWorkload gate (its limit is each workload's, in its WorkloadView)."""
    unavailable: bool
    """The MaxUnavailablePerWorkload gate."""
    _given: dict[tuple[str, str, int, int], Verdict] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, args: MigrationArgs) -> Limits:
        def limit(gate: str, value: int | None) -> int:
            return (value or 0) if args.gate_on(gate) else 0

        return cls(
            globally=limit("MaxMigratingGlobally", args.max_migrating_globally),
            per_node=limit("MaxMigratingPerNode", args.max_migrating_per_node),
            per_namespace=limit("MaxMigratingPerNamespace", args.max_migrating_per_namespace),
            per_workload=args.gate_on("MaxMigratingPerWorkload"),
            unavailable=args.gate_on("MaxUnavailablePerWorkload"),
        )

    def verdict(self, name: str, subject: str, count: int = 0, limit: int = 0) -> Verdict:
        """The Verdict of filter `name` with its message (MESSAGES) filled in; the same object for the same
        figures."""
        given = self._given.get((name, subject, count, limit))
        if given is None:
            message = MESSAGES[name].format(subject=subject, count=count, limit=limit)
            given = self._given[(name, subject, count, limit)] = Verdict(name, message)
        return given

    def hold(self, migrating: Migrating, pod: Held) -> Verdict | None:
        """retryable's answer for these limits, for a pod without the evict annotation. (Two arguments: the
        arbiter calls this for every waiting job of every round.)"""
        key, node = pod.key, pod.node
        own = migrating.jobs_of.get(key, 0)
        limit = self.globally
        if limit and (total := migrating.total - own) >= limit:
            return self.verdict("MaxMigratingGlobally", "", total, limit)
        limit = self.per_node
        if limit and node:
            on_node = migrating.by_node.get(node, _NONE)
            if (others := len(on_node) - (key in on_node)) >= limit:
                return self.verdict("MaxMigratingPerNode", node, others, limit)
        limit = self.per_namespace
        if limit and (count := migrating.by_namespace.get(pod.pod_namespace, 0) - own) >= limit:
            return self.verdict("MaxMigratingPerNamespace", pod.pod_namespace, count, limit)
        owner, workload = pod.owner_uid, pod.workload
        if owner is None:
            return None
        if not pod.owner_known or workload is None:
            return self.verdict("Workload", key)
        moving = migrating.by_workload.get(owner, _NONE)
        moving_count = len(moving) - (key in moving)
        limit = workload.max_migrating
        if self.per_workload and moving_count and moving_count >= limit:
            return self.verdict("MaxMigratingPerWorkload", owner, moving_count, limit)
        if self.unavailable:
            limit = workload.max_unavailable
            unready = workload.unready
            # |unready ∪ (moving − {key})|; `moving` is small (at most the workload's limits), `unready` may not be
            unavailable = len(unready)
            if moving:
                unavailable += len(moving.difference(unready)) - (key in moving and key not in unready)
            if unavailable >= limit:
                return self.verdict("MaxUnavailablePerWorkload", owner, unavailable, limit)
        return None


def active(pod: kube.Pod) -> bool:
    """Not being deleted and not finished."""
    return pod.metadata.deletion_timestamp is None and pod.status.phase not in ("Succeeded", "Failed")


def workload_views(
    workloads: Mapping[str, migration.Workload], pods: Mapping[str, kube.Pod], args: MigrationArgs
) -> dict[str, WorkloadView]:
    """Each workload with its pods (those whose controller is it) and its limits."""
    members: dict[str, list[kube.Pod]] = {uid: [] for uid in workloads}
    for pod in pods.values():
        owner = kube.controller_of(pod.metadata)
        if owner is not None and owner.uid in members:
            members[owner.uid].append(pod)
    return {
        uid: WorkloadView(
            uid=uid,
            replicas=w.replicas,
            unready=frozenset(kube.pod_key(p) for p in members[uid] if not (active(p) and kube.pod_ready(p))),
            max_migrating=get_max_unavailable(w.replicas, args.max_migrating_per_workload),
            max_unavailable=get_max_unavailable(w.replicas, args.max_unavailable_per_workload),
        )
        for uid, w in workloads.items()
    }


def fits_elsewhere(
    pod: kube.Pod, nodes: Sequence[SchedulingNode], pods_on: Mapping[str, Sequence[SchedulingPod]]
) -> Verdict | None:
    """NodeFit: None when the pod fits a node other than its own (`pods_on`: each node's pods), else why not."""
    candidate = scheduling_pod(pod)
    others = [node for node in nodes if node.metadata.name != pod.spec.node_name]
    for node in others:
        if lownodeload_util.node_fit(candidate, node, pods_on.get(node.metadata.name, ())):
            return None
    return Verdict(
        "NodeFit",
        f"pod {kube.pod_key(pod)} fits none of the {len(others)} other node(s) (node selector and affinity, taints, "
        "requests against what is left of allocatable)",
    )
