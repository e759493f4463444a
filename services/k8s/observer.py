"""The observing half of the Kubernetes bridge: Nodes, Pods, the colocation ConfigMap, NodeResourceTopologies, pod
controllers, PodMigrationJobs, and what the webhook's Pod mutation reads (ClusterColocationProfiles, Namespaces,
PriorityClasses).

`ClusterObserver` runs four reflectors (services.k8s.watch): all Nodes, Pods of all namespaces, the one `slo-
controller-config` ConfigMap (a fieldSelector on its name) and all NodeResourceTopologies (optional: a cluster
without that CRD keeps the reflector retrying, and readiness does not wait for it), and, optional likewise,
ReplicaSets, StatefulSets and Jobs (WorkloadObserved with their expected replicas), PodMigrationJobs (each a
MigrationRequested on KOORD_MIGRATION, its deletion a MigrationAborted), ClusterColocationProfiles, Namespaces
(their labels) and PriorityClasses (value, preemptionPolicy) for services.webhook. Each change is decoded into
schemas.kube here and only here (an object that does not decode, e.g. a bad quantity, or whose name or namespace
Kubernetes' rules refuse, schemas.names, is logged, counted and skipped: never published) and becomes a
NodeObserved / PodObserved / ConfigMapObserved / NodeTopologyObserved / ColocationProfileObserved /
NamespaceObserved / PriorityClassObserved on its own last-value subject, with a
Nats-Msg-Id derived from kind, namespace, name, resourceVersion and deletion, so republishing an unchanged object
is deduplicated.

Publishing never blocks the watches: the latest state per object waits in a pending map (bounded by the number of
objects, a newer state replaces an unpublished older one) and a publisher task drains it, retrying with backoff
while the bus is away. `ready` is set once the first list of every required kind is published. Started by the
composition root (koordbus) with an ApiClient from services.k8s.client; read back by the services (schemas.cluster).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import itertools
import logging
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Final

import msgspec
from kubernetes_asyncio.client import (
    ApiClient,
    AppsV1Api,
    BatchV1Api,
    CoreV1Api,
    CustomObjectsApi,
    SchedulingV1Api,
)
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from bus import subjects
from bus.api import Bus, msg_id
from schemas import cluster, kube, migration, migration_events, names, scheduling, topology
from schemas.koordinator import ANNOTATION_CPU_BASIC_INFO
from services.common.tasks import cancel_and_wait
from services.k8s import core
from services.k8s.settings import K8sSettings
from services.k8s.watch import Collection, KubeCollection, Reflector

log = logging.getLogger(__name__)

KIND_NODE: Final = "node"
KIND_POD: Final = "pod"
KIND_CONFIGMAP: Final = "configmap"
KIND_TOPOLOGY: Final = "nrt"
KIND_REPLICASET: Final = "replicaset"
KIND_STATEFULSET: Final = "statefulset"
KIND_JOB: Final = "job"
KIND_MIGRATION_JOB: Final = "podmigrationjob"
KIND_PROFILE: Final = "clustercolocationprofile"
KIND_NAMESPACE: Final = "namespace"
KIND_PRIORITY_CLASS: Final = "priorityclass"
ADMISSION_KINDS: Final = (KIND_PROFILE, KIND_NAMESPACE, KIND_PRIORITY_CLASS)
"""What the webhook's Pod mutation reads (services.webhook)."""
WORKLOAD_KINDS: Final = {
    KIND_REPLICASET: ("apps/v1", "ReplicaSet"),
    KIND_STATEFULSET: ("apps/v1", "StatefulSet"),
    KIND_JOB: ("batch/v1", "Job"),
}
"""Pod controllers the migration arbiter counts replicas of."""
KINDS: Final = (
    KIND_NODE,
    KIND_POD,
    KIND_CONFIGMAP,
    KIND_TOPOLOGY,
    *WORKLOAD_KINDS,
    KIND_MIGRATION_JOB,
    *ADMISSION_KINDS,
)
OPTIONAL_KINDS: Final = frozenset({KIND_TOPOLOGY, *WORKLOAD_KINDS, KIND_MIGRATION_JOB, *ADMISSION_KINDS})
"""Kinds whose CRD a cluster may lack, or which only a part of koordbus reads (the webhook's, which a bridge with the
RBAC of an older chart may not list): readiness does not wait for their first list (the reflector keeps retrying,
so installing the CRD or granting the right later is picked up)."""
TOPOLOGY_API: Final = {"group": "topology.node.k8s.io", "version": "v1alpha1", "plural": "noderesourcetopologies"}
MIGRATION_JOB_API: Final = {"group": "scheduling.koordinator.sh", "version": "v1alpha1", "plural": "podmigrationjobs"}
PROFILE_API: Final = {"group": "config.koordinator.sh", "version": "v1alpha1", "plural": "clustercolocationprofiles"}


class _WorkloadSpec(msgspec.Struct, frozen=True):
    replicas: int | None = None
    parallelism: int | None = None


class _Workload(msgspec.Struct, frozen=True):
    metadata: kube.ObjectMeta = kube.ObjectMeta()
    spec: _WorkloadSpec = _WorkloadSpec()


class _ConfigMap(msgspec.Struct, frozen=True):
    data: dict[str, str] | None = None


class _Labels(msgspec.Struct, frozen=True):
    labels: dict[str, str] | None = None


class _Namespace(msgspec.Struct, frozen=True):
    metadata: _Labels = _Labels()


class _PriorityClass(msgspec.Struct, frozen=True, rename="camel"):
    value: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)] = 0
    preemption_policy: str | None = None


_NODE_DECODER: Final = msgspec.json.Decoder(scheduling.SchedulingNode)  # spec.taints and unschedulable for nodeFit
_POD_DECODER: Final = msgspec.json.Decoder(scheduling.SchedulingPod)  # nodeSelector, affinity, tolerations
_CONFIGMAP_DECODER: Final = msgspec.json.Decoder(_ConfigMap)
_TOPOLOGY_DECODER: Final = msgspec.json.Decoder(topology.NodeResourceTopology)
_WORKLOAD_DECODER: Final = msgspec.json.Decoder(_Workload)
_MIGRATION_JOB_DECODER: Final = msgspec.json.Decoder(migration.PodMigrationJob)
_PROFILE_DECODER: Final = msgspec.json.Decoder(cluster.ColocationProfile)
_NAMESPACE_DECODER: Final = msgspec.json.Decoder(_Namespace)
_PRIORITY_CLASS_DECODER: Final = msgspec.json.Decoder(_PriorityClass)

Outgoing = tuple[str, bytes, str]
"""(subject, data, msg id) of one observed state."""


def _workload_message(kind: str, change: core.Change, *, observed_at: float) -> Outgoing:
    namespace, name = change.key
    api_version, kind_name = WORKLOAD_KINDS[kind]
    seen = change.seen
    replicas = 0
    if not change.deleted and change.raw is not None:
        spec = _WORKLOAD_DECODER.decode(change.raw).spec
        chosen = spec.parallelism if kind == KIND_JOB else spec.replicas
        replicas = 1 if chosen is None else chosen  # Kubernetes' default for both
    event = cluster.WorkloadObserved(
        namespace=namespace,
        name=name,
        observed_at=observed_at,
        api_version=api_version,
        kind=kind_name,
        uid=seen.uid,
        replicas=replicas,
        resource_version=seen.resource_version,
        deleted=change.deleted,
    )
    identity = msg_id("k8s.observed", kind, namespace, name, seen.resource_version, change.deleted)
    return subjects.cluster_workload(namespace, name), msgspec.json.encode(event), identity


def _migration_job_message(change: core.Change, *, observed_at: float) -> Outgoing:
    """A PodMigrationJob becomes a MigrationRequested (the arbiter keeps the first request per job name); its
    deletion a MigrationAborted."""
    _, name = change.key
    at = dt.datetime.fromtimestamp(observed_at, dt.UTC)
    seen = change.seen
    if change.deleted or change.raw is None:
        aborted = migration_events.MigrationAborted(job=name, actor="cluster: PodMigrationJob deleted", time=at)
        identity = msg_id("k8s.pmj.deleted", name, seen.uid)
        return subjects.MIGRATION_ABORTS, migration_events.encode_migration_event(aborted), identity
    job = _MIGRATION_JOB_DECODER.decode(change.raw)
    requested = migration_events.MigrationRequested(job=job, source="cluster", actor="cluster", time=at)
    identity = msg_id("k8s.pmj", name, seen.uid)
    return subjects.MIGRATION_REQUESTS, migration_events.encode_migration_event(requested), identity


def _admission_message(kind: str, change: core.Change, *, observed_at: float) -> Outgoing:
    """A ClusterColocationProfile, Namespace or PriorityClass (cluster-scoped, each on its own subject)."""
    _, name = change.key
    seen = change.seen
    gone = change.deleted or change.raw is None
    event: cluster.AdmissionEvent
    if kind == KIND_PROFILE:
        profile = None if gone else _PROFILE_DECODER.decode(change.raw or b"")
        event = cluster.ColocationProfileObserved(
            name=name,
            observed_at=observed_at,
            resource_version=seen.resource_version,
            deleted=change.deleted,
            profile=profile,
        )
        subject = subjects.cluster_profile(name)
    elif kind == KIND_NAMESPACE:
        labels = {} if gone else _NAMESPACE_DECODER.decode(change.raw or b"").metadata.labels or {}
        event = cluster.NamespaceObserved(
            name=name,
            observed_at=observed_at,
            resource_version=seen.resource_version,
            deleted=change.deleted,
            labels=labels,
        )
        subject = subjects.cluster_namespace(name)
    else:
        found = _PriorityClass() if gone else _PRIORITY_CLASS_DECODER.decode(change.raw or b"")
        event = cluster.PriorityClassObserved(
            name=name,
            observed_at=observed_at,
            resource_version=seen.resource_version,
            deleted=change.deleted,
            value=found.value,
            preemption_policy=found.preemption_policy,
        )
        subject = subjects.cluster_priority_class(name)
    identity = msg_id("k8s.observed", kind, "", name, seen.resource_version, change.deleted)
    return subject, msgspec.json.encode(event), identity


def observed_message(kind: str, change: core.Change, *, observed_at: float) -> Outgoing:
    """The event for one change, on its subject, with its deterministic msg id.

    msgspec.DecodeError (ValidationError included) when the object does not decode into schemas.kube;
    schemas.names.InvalidName when its name or namespace is not one Kubernetes allows (it would become a subject).
    """
    namespace, name = change.key
    if namespace:
        names.namespace(namespace, "metadata.namespace")
    names.object_name(name, "metadata.name")
    if kind in WORKLOAD_KINDS:
        return _workload_message(kind, change, observed_at=observed_at)
    if kind == KIND_MIGRATION_JOB:
        return _migration_job_message(change, observed_at=observed_at)
    if kind in ADMISSION_KINDS:
        return _admission_message(kind, change, observed_at=observed_at)
    namespace, name = change.key
    seen = change.seen
    event: cluster.ClusterEvent
    if kind == KIND_NODE:
        node = None if change.deleted or change.raw is None else _NODE_DECODER.decode(change.raw)
        event = cluster.NodeObserved(
            name=name,
            observed_at=observed_at,
            resource_version=seen.resource_version,
            deleted=change.deleted,
            node=node,
        )
        subject = subjects.cluster_node(name)
    elif kind == KIND_POD:
        pod = None if change.deleted or change.raw is None else _POD_DECODER.decode(change.raw)
        event = cluster.PodObserved(
            namespace=namespace,
            name=name,
            observed_at=observed_at,
            uid=seen.uid,
            node_name=seen.node_name,
            resource_version=seen.resource_version,
            deleted=change.deleted,
            pod=pod,
        )
        subject = subjects.cluster_pod(namespace, name)
    elif kind == KIND_CONFIGMAP:
        data = {} if change.deleted or change.raw is None else _CONFIGMAP_DECODER.decode(change.raw).data or {}
        event = cluster.ConfigMapObserved(
            namespace=namespace,
            name=name,
            observed_at=observed_at,
            resource_version=seen.resource_version,
            deleted=change.deleted,
            data=data,
        )
        subject = subjects.cluster_configmap(namespace, name)
    elif kind == KIND_TOPOLOGY:
        nrt = None if change.deleted or change.raw is None else _TOPOLOGY_DECODER.decode(change.raw)
        event = cluster.NodeTopologyObserved(
            name=name,
            observed_at=observed_at,
            resource_version=seen.resource_version,
            deleted=change.deleted,
            zones=None if nrt is None else nrt.zones,
            cpu_basic_info=_cpu_basic_info(nrt),
        )
        subject = subjects.cluster_topology(name)
    else:
        raise ValueError(f"unknown kind {kind!r}")
    identity = msg_id("k8s.observed", kind, namespace, name, seen.resource_version, change.deleted)
    return subject, msgspec.json.encode(event), identity


@dataclass(kw_only=True)
class ObserverStats:
    """What the observer counts besides its reflectors' own stats."""

    observed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    """Object states (tombstones included) accepted for publishing, per kind."""
    decode_failures: dict[str, int] = field(default_factory=lambda: dict.fromkeys(KINDS, 0))
    """Objects skipped because they do not decode into schemas.kube (bad quantity, wrong type …) or carry a name
    Kubernetes' rules refuse (schemas.names), per kind."""
    published: int = 0
    duplicates: int = 0
    """Publishes the stream recognised as already stored (same msg id inside the duplicate window)."""
    publish_failures: int = 0


class ClusterObserver:
    """Lists and watches the cluster and publishes what it sees; `start`, then `stop`.

    The ApiClient belongs to the caller. `registry` gets the koordbus_k8s_* metrics while started; `collections`
    (kind → Collection) replaces the three API collections, for tests without an API server.
    """

    def __init__(
        self,
        bus: Bus,
        api: ApiClient,
        settings: K8sSettings,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        collections: dict[str, Collection] | None = None,
    ) -> None:
        self.bus = bus
        self.settings = settings
        self.stats = ObserverStats()
        self.ready = asyncio.Event()
        """Set once the first list of every kind is published."""
        self._api = api
        self.registry = registry
        self._clock = clock
        self._sleep = sleep
        self._collections = collections
        self._pending: dict[str, tuple[str, bytes, str]] = {}
        """kind/namespace/name → (subject, data, msg id) of the object's latest unpublished state."""
        self._has_pending = asyncio.Event()
        self._drained = asyncio.Event()
        self._drained.set()
        self.reflectors: dict[str, Reflector] = {}
        self._tasks: list[asyncio.Task[None]] = []
        self._collector: _ObserverCollector | None = None

    def _default_collections(self) -> dict[str, Collection]:
        core_api = CoreV1Api(self._api)
        timeout, grace = self.settings.watch_timeout_seconds, self.settings.watch_read_grace_seconds
        return {
            KIND_NODE: KubeCollection(
                KIND_NODE, core_api.list_node, namespaced=False, watch_timeout_seconds=timeout, read_grace_seconds=grace
            ),
            KIND_POD: KubeCollection(
                KIND_POD,
                core_api.list_pod_for_all_namespaces,
                namespaced=True,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
            ),
            KIND_CONFIGMAP: KubeCollection(
                KIND_CONFIGMAP,
                core_api.list_namespaced_config_map,
                namespaced=True,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
                namespace=self.settings.configmap_namespace,
                field_selector=f"metadata.name={self.settings.configmap_name}",
            ),
            KIND_TOPOLOGY: KubeCollection(
                KIND_TOPOLOGY,
                CustomObjectsApi(self._api).list_cluster_custom_object,
                namespaced=False,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
                **TOPOLOGY_API,
            ),
            KIND_REPLICASET: KubeCollection(
                KIND_REPLICASET,
                AppsV1Api(self._api).list_replica_set_for_all_namespaces,
                namespaced=True,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
            ),
            KIND_STATEFULSET: KubeCollection(
                KIND_STATEFULSET,
                AppsV1Api(self._api).list_stateful_set_for_all_namespaces,
                namespaced=True,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
            ),
            KIND_JOB: KubeCollection(
                KIND_JOB,
                BatchV1Api(self._api).list_job_for_all_namespaces,
                namespaced=True,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
            ),
            KIND_MIGRATION_JOB: KubeCollection(
                KIND_MIGRATION_JOB,
                CustomObjectsApi(self._api).list_cluster_custom_object,
                namespaced=False,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
                **MIGRATION_JOB_API,
            ),
            KIND_PROFILE: KubeCollection(
                KIND_PROFILE,
                CustomObjectsApi(self._api).list_cluster_custom_object,
                namespaced=False,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
                **PROFILE_API,
            ),
            KIND_NAMESPACE: KubeCollection(
                KIND_NAMESPACE,
                core_api.list_namespace,
                namespaced=False,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
            ),
            KIND_PRIORITY_CLASS: KubeCollection(
                KIND_PRIORITY_CLASS,
                SchedulingV1Api(self._api).list_priority_class,
                namespaced=False,
                watch_timeout_seconds=timeout,
                read_grace_seconds=grace,
            ),
        }

    @property
    def pending(self) -> int:
        """Observed states not yet stored by the bus."""
        return len(self._pending)

    async def start(self) -> None:
        collections = self._collections or self._default_collections()
        self.reflectors = {
            kind: Reflector(
                collection,
                self._accept,
                backoff_initial_seconds=self.settings.backoff_initial_seconds,
                backoff_max_seconds=self.settings.backoff_max_seconds,
                clock=self._clock,
                sleep=self._sleep,
            )
            for kind, collection in collections.items()
        }
        if self.registry is not None:
            self._collector = _ObserverCollector(self)
            self.registry.register(self._collector)
        self._tasks = [
            asyncio.create_task(reflector.run(), name=f"k8s-reflector-{kind}")
            for kind, reflector in self.reflectors.items()
        ]
        self._tasks.append(asyncio.create_task(self._publish_loop(), name="k8s-publisher"))
        self._tasks.append(asyncio.create_task(self._become_ready(), name="k8s-ready"))

    async def stop(self) -> None:
        """Stop watching and publishing; what is still pending is published again by the next start's list."""
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            await cancel_and_wait(task)
        self._tasks = []
        if self.registry is not None and self._collector is not None:
            self.registry.unregister(self._collector)
            self._collector = None

    async def wait_published(self, timeout: float) -> bool:
        """True once nothing is pending (everything observed so far is stored), False on timeout."""
        try:
            async with asyncio.timeout(timeout):
                await self._drained.wait()
        except TimeoutError:
            return False
        return True

    # --- reflector sink: decode, queue the latest state per object

    def _accept(self, kind: str, changes: list[core.Change]) -> None:
        observed_at = self._clock()
        for change in changes:
            try:
                subject, data, identity = observed_message(kind, change, observed_at=observed_at)
            except (msgspec.DecodeError, names.InvalidName) as err:
                self.stats.decode_failures[kind] = self.stats.decode_failures.get(kind, 0) + 1
                namespace, name = change.key
                shown = f"{names.shown(namespace)}/{names.shown(name)}" if namespace else names.shown(name)
                log.warning("k8s %s %s skipped: %s", kind, shown, err)
                continue
            self.stats.observed[kind] = self.stats.observed.get(kind, 0) + 1
            namespace, name = change.key
            self._pending[f"{kind}/{namespace}/{name}"] = (subject, data, identity)
        if self._pending:
            self._drained.clear()
            self._has_pending.set()

    # --- publishing

    async def _publish_loop(self) -> None:
        failures = 0
        while True:
            if not self._pending:
                self._has_pending.clear()
                self._drained.set()
                await self._has_pending.wait()
                continue
            batch = list(itertools.islice(self._pending.items(), self.settings.publish_batch_size))
            results = await asyncio.gather(
                *(self.bus.publish(subject, data, msg_id=identity) for _, (subject, data, identity) in batch),
                return_exceptions=True,
            )
            errors: list[BaseException] = []
            for (key, entry), result in zip(batch, results, strict=True):
                if isinstance(result, BaseException):
                    errors.append(result)
                    continue
                if self._pending.get(key) is entry:  # not replaced by a newer state meanwhile
                    del self._pending[key]
                self.stats.published += 1
                self.stats.duplicates += int(result.duplicate)
            if not errors:
                failures = 0
                continue
            failures += 1
            self.stats.publish_failures += len(errors)
            delay = core.backoff_delay(
                failures, initial=self.settings.backoff_initial_seconds, maximum=self.settings.backoff_max_seconds
            )
            log.warning(
                "k8s: %d of %d publishes failed (%d states pending, retry in %.2fs): %s",
                len(errors),
                len(batch),
                len(self._pending),
                delay,
                errors[0],
            )
            await self._sleep(delay)

    async def _become_ready(self) -> None:
        for kind, reflector in self.reflectors.items():
            if kind not in OPTIONAL_KINDS:
                await reflector.listed.wait()
        await self._drained.wait()
        self.ready.set()
        log.info("k8s: first lists of %s published", ", ".join(self.reflectors))


class _ObserverCollector:
    """Exports the observer's and its reflectors' counters on the registry it is registered with."""

    def __init__(self, observer: ClusterObserver) -> None:
        self._observer = observer

    def describe(self) -> list[Metric]:
        return list(self.collect())

    def collect(self) -> Iterator[Metric]:
        observer = self._observer
        per_kind = {
            "objects_observed": "Object states (tombstones included) seen and queued for publishing",
            "decode_failures": "Objects skipped because they do not decode (bad quantity, wrong type …) or their name "
            "is not a Kubernetes name",
            "relists": "Lists after the first one, after a watch's resourceVersion expired (410 Gone)",
            "watch_restarts": "Watches opened again after a clean end, a disconnect or an error",
            "watch_errors": "Lists or watches that failed and were retried with backoff",
            "bad_events": "Watch events or listed items that could not be understood (skipped)",
        }
        for name, help_text in per_kind.items():
            family = CounterMetricFamily(f"koordbus_k8s_{name}", help_text, labels=("kind",))
            for kind, reflector in observer.reflectors.items():
                if name == "objects_observed":
                    value = observer.stats.observed.get(kind, 0)
                elif name == "decode_failures":
                    value = observer.stats.decode_failures.get(kind, 0)
                else:
                    value = getattr(reflector.stats, name)
                family.add_metric([kind], value)
            yield family
        last_event = GaugeMetricFamily(
            "koordbus_k8s_last_event_timestamp_seconds", "Time of the newest list or watch event", labels=("kind",)
        )
        for kind, reflector in observer.reflectors.items():
            last_event.add_metric([kind], reflector.stats.last_event_at)
        yield last_event
        yield CounterMetricFamily(
            "koordbus_k8s_published", "Observed states stored by the bus", value=observer.stats.published
        )
        yield CounterMetricFamily(
            "koordbus_k8s_publish_failures",
            "Publishes that failed and are retried",
            value=observer.stats.publish_failures,
        )
        yield GaugeMetricFamily(
            "koordbus_k8s_pending_states", "Observed states waiting for the bus", value=observer.pending
        )
        yield GaugeMetricFamily(
            "koordbus_k8s_ready", "1 once the first list of every kind is published", value=int(observer.ready.is_set())
        )


def _cpu_basic_info(nrt: topology.NodeResourceTopology | None) -> str:
    """The NodeResourceTopology's cpu-basic-info annotation, or "" when absent or too long to be koordlet's."""
    text = "" if nrt is None else nrt.metadata.annotations.get(ANNOTATION_CPU_BASIC_INFO, "")
    return text if len(text) <= cluster.MAX_CPU_BASIC_INFO else ""
