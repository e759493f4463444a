"""Pure batching for the node agent: the join of measured pods with the kubelet's pod list (`attribute_pods`) and with
the CPI counts that finished (`attach_cpi`), samples (the node's, its pods' and containers', its NodeSLO host
applications') into one NodeMetricsReported per publish window, and the bounded outbox that holds batches while the
bus is away.

Called by agent/service.py. Windows are aligned to wall-clock multiples of the publish interval, so the
nodemetric service's reports fall on batch boundaries; the same ticks always build the same batches.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import msgspec

from agent.actuate import NodePod
from agent.core import HostAppSample, PodSample, Tick
from agent.cpi import CpiCount
from schemas import kube, resources, vocab
from schemas.cpi import PodCpiSample
from schemas.node import (
    TRAINING_PERCENTILE,
    ContainerRef,
    ContainerSampleColumns,
    HostApplicationSamples,
    NodeMetricsReported,
    NumaSample,
    PodRef,
    PodSampleColumns,
    Sample,
    TrainingRound,
    pod_list_digest,
)
from schemas.percentile import nearest_rank
from schemas.psi import PodPsiColumns, PsiSample

_KOORD_LABELS = (vocab.PRIORITY_CLASS_LABEL, vocab.QOS_CLASS_LABEL)
"""The labels a pod's Koordinator classes come from (spec §0); the batch carries these and no others."""


def identify(uid: str, kube_qos: str, listed: NodePod | None) -> PodRef:
    """The batch's entry for a pod measured under `uid`: by UID and its cgroup's kube QoS alone when the kubelet
    does not list it (yet), else with the list's namespace, name, priority, priorityClassName, Koordinator labels,
    status.qosClass (the cgroup's QoS when the list has none yet) and what the prod predictor reads: the effective
    cpu and memory request, the creation time and whether it is terminating or finished."""
    if listed is None:
        return PodRef(uid=uid, kube_qos=kube_qos)
    pod = listed.pod
    labels = {k: pod.metadata.labels[k] for k in _KOORD_LABELS if k in pod.metadata.labels}
    request = kube.pod_request(pod)
    created = pod.metadata.creation_timestamp
    return PodRef(
        uid=uid,
        kube_qos=pod.status.qos_class or kube_qos,
        namespace=pod.metadata.namespace,
        name=pod.metadata.name,
        priority=pod.spec.priority,
        labels=labels,
        priority_class_name=pod.spec.priority_class_name,
        cpu_request=request.get(resources.CPU, 0),
        memory_request=request.get(resources.MEMORY, 0),
        created_at=None if created is None else kube.unix_seconds(created),
        terminating=pod.metadata.deletion_timestamp is not None
        or pod.status.phase in (kube.PHASE_SUCCEEDED, kube.PHASE_FAILED),
    )


class PodIdentities:
    """The kubelet's pod list by UID, each pod's batch entry (`identify`) made once per list and cgroup QoS.

    The agent joins every second's samples with the same list until it reads the list again, so the entries (the
    pod's effective requests parsed from its spec among them) are made on first use and reused: a simulated
    cluster's process joins thousands of pods a second, and making each entry anew was a third of its CPU
    (py-spy over `bench/soak.py`, 1,000 simulated nodes)."""

    def __init__(self, listed: Iterable[NodePod]) -> None:
        self._by_uid = {p.uid: p for p in listed}
        self._refs: dict[tuple[str, str], PodRef] = {}

    def relisted(self, listed: Iterable[NodePod]) -> PodIdentities:
        """The identities of a newer list, keeping the entries of pods it lists as the very same objects (a
        simulated node lists the same NodePod objects window after window)."""
        new = PodIdentities(listed)
        new._refs = {key: ref for key, ref in self._refs.items() if new._by_uid.get(key[0]) is self._by_uid.get(key[0])}
        return new

    def ref(self, uid: str, kube_qos: str) -> PodRef:
        """`identify` of the pod measured under `uid` in a cgroup of `kube_qos`."""
        key = (uid, kube_qos)
        made = self._refs.get(key)
        if made is None:
            made = self._refs[key] = identify(uid, kube_qos, self._by_uid.get(uid))
        return made


def attribute_pods(
    measured: Sequence[PodSample], listed: PodIdentities | Iterable[NodePod] | None
) -> tuple[PodSample, ...]:
    """Join what was measured in cgroups (by pod UID) with the kubelet's pod list: each sample's pod named as the
    list names it (`identify`). Only measured pods come out: a listed pod without a cgroup is not invented, and a
    measured pod the list does not name (its cgroup appeared first, or there is no list) stays known by UID. Pass
    the list as PodIdentities when joining it more than once."""
    if listed is None:
        return tuple(measured)
    identities = listed if isinstance(listed, PodIdentities) else PodIdentities(listed)
    return tuple(msgspec.structs.replace(s, pod=identities.ref(s.pod.uid, s.pod.kube_qos)) for s in measured)


def attach_cpi(samples: Sequence[PodSample], counts: Mapping[str, CpiCount]) -> tuple[PodSample, ...]:
    """The pods' samples with the CPI counts (by pod uid) that finished since the previous collection; a count of a
    pod without a sample in this collection (gone, or just appeared) is dropped."""
    if not counts:
        return tuple(samples)
    return tuple(msgspec.structs.replace(s, cpi=counts[s.pod.uid]) if s.pod.uid in counts else s for s in samples)


def window_start_of(at: float, interval: float) -> float:
    """Start of the wall-clock aligned window [k·interval, (k+1)·interval) holding `at`."""
    return math.floor(at / interval) * interval


@dataclass
class _Series:
    """Samples of one cgroup in arrival order, kept as the columns they are published as.

    Only pods publish a page-cache column, so container series leave it empty.
    """

    t: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)
    memory: list[int] = field(default_factory=list)
    memory_with_page_cache: list[int] = field(default_factory=list)

    def append(self, sample: Sample, memory_with_page_cache: int | None = None) -> None:
        self.t.append(sample[0])
        self.cpu.append(sample[1])
        self.memory.append(sample[2])
        if memory_with_page_cache is not None:
            self.memory_with_page_cache.append(memory_with_page_cache)


@dataclass
class _PodAccumulator:
    pod: PodRef
    samples: _Series = field(default_factory=_Series)
    containers: dict[str, _Series] = field(default_factory=dict)
    psi: list[PsiSample] = field(default_factory=list)
    cpi: list[CpiCount] = field(default_factory=list)


def _pod_columns(pods: list[_PodAccumulator]) -> PodSampleColumns:
    """Rows grouped by pod in `pods` order; each pod's rows are in tick (time) order."""
    index: list[int] = []
    t: list[float] = []
    cpu: list[float] = []
    memory: list[int] = []
    with_cache: list[int] = []
    for i, acc in enumerate(pods):
        index += [i] * len(acc.samples.t)
        t += acc.samples.t
        cpu += acc.samples.cpu
        memory += acc.samples.memory
        with_cache += acc.samples.memory_with_page_cache
    return PodSampleColumns.of(pod=index, t=t, cpu=cpu, memory=memory, memory_with_page_cache=with_cache)


def _container_columns(pods: list[_PodAccumulator]) -> tuple[list[ContainerRef], ContainerSampleColumns]:
    """Containers grouped by pod in `pods` order, by ID within a pod; rows grouped by container."""
    refs: list[ContainerRef] = []
    index: list[int] = []
    t: list[float] = []
    cpu: list[float] = []
    memory: list[int] = []
    for pod_index, acc in enumerate(pods):
        for container_id, series in sorted(acc.containers.items()):
            index += [len(refs)] * len(series.t)
            refs.append(ContainerRef(pod=pod_index, id=container_id))
            t += series.t
            cpu += series.cpu
            memory += series.memory
    return refs, ContainerSampleColumns.of(container=index, t=t, cpu=cpu, memory=memory)


@dataclass
class _HostAppAccumulator:
    """One host application's samples of the window; its classes as the newest tick gave them."""

    newest: HostAppSample
    samples: list[Sample] = field(default_factory=list)
    memory_with_page_cache: list[int] = field(default_factory=list)

    def add(self, app: HostAppSample) -> None:
        self.newest = app
        self.samples.append(app.sample)
        self.memory_with_page_cache.append(app.memory_with_page_cache)

    def batch_entry(self) -> HostApplicationSamples:
        return HostApplicationSamples(
            name=self.newest.name,
            priority=self.newest.priority,
            qos=self.newest.qos,
            samples=self.samples,
            memory_with_page_cache=self.memory_with_page_cache,
        )


TRAINING_INTERVAL_SECONDS = 60.0
"""koordlet trains its prediction models every minute (spec §1.7)."""


class TrainingAccumulator:
    """The node's and each pod's samples of the current training round, [k·interval, (k+1)·interval) of wall-clock
    time, closed into a TrainingRound by the batch whose window ends the round.

    A tick of another round starts that round afresh (what an agent asleep through a round end, or a simulated node
    asked for a window out of order, had of the old one is dropped), so a round holds only its own samples and is
    complete when its batches were built in order."""

    def __init__(self, interval: float = TRAINING_INTERVAL_SECONDS) -> None:
        if interval <= 0:
            raise ValueError(f"training interval must be positive, got {interval}")
        self.interval = interval
        self._start: float | None = None
        self._node_cpu: list[float] = []
        self._node_memory: list[float] = []
        self._pods: dict[str, tuple[list[float], list[float]]] = {}

    def add(self, tick: Tick) -> None:
        start = window_start_of(tick.at, self.interval)
        if start != self._start:
            self._start, self._node_cpu, self._node_memory, self._pods = start, [], [], {}
        if tick.node is not None:
            self._node_cpu.append(tick.node[1])
            self._node_memory.append(tick.node[2])
        for ps in tick.pods:
            cpu, memory = self._pods.setdefault(ps.pod.uid, ([], []))
            cpu.append(ps.sample[1])
            memory.append(ps.sample[2])

    def close(self, end: float, pods: Sequence[PodRef]) -> TrainingRound | None:
        """The round ending at `end` for the pods of the batch ending there (in its list's order); None when `end`
        ends no round this accumulator holds (it then keeps collecting). After a round it starts the next one empty."""
        start = self._start
        if start is None or window_start_of(end, self.interval) != end or end != start + self.interval:
            return None
        index: list[int] = []
        pod_cpu: list[float] = []
        pod_memory: list[int] = []
        for i, pod in enumerate(pods):
            samples = self._pods.get(pod.uid)
            if samples:
                index.append(i)
                pod_cpu.append(nearest_rank(samples[0], TRAINING_PERCENTILE))
                pod_memory.append(int(nearest_rank(samples[1], TRAINING_PERCENTILE)))
        node = bool(self._node_cpu)
        round_ = TrainingRound(
            start=start,
            end=end,
            node_cpu=nearest_rank(self._node_cpu, TRAINING_PERCENTILE) if node else None,
            node_memory=int(nearest_rank(self._node_memory, TRAINING_PERCENTILE)) if node else None,
            pods=index,
            pod_cpu=pod_cpu,
            pod_memory=pod_memory,
        )
        self._start, self._node_cpu, self._node_memory, self._pods = None, [], [], {}
        return round_


class BatchBuilder:
    """Accumulates ticks of the current window and hands back the finished batch once a tick passes its end; the
    batch that ends a training round carries it (`training`: the builder's own accumulator unless one is given,
    as a simulated node that builds each window with a new builder gives its long-lived one).

    Empty windows (agent just started, or asleep through a whole window) produce nothing.
    """

    def __init__(self, node: str, *, interval: float, training: TrainingAccumulator | None = None) -> None:
        if interval <= 0:
            raise ValueError(f"publish interval must be positive, got {interval}")
        self.node = node
        self.interval = interval
        self.training = training if training is not None else TrainingAccumulator()
        self._start: float | None = None
        self._node: list[Sample] = []
        self._node_with_cache: list[tuple[float, int]] = []
        self._node_with_hot_page: list[tuple[float, int]] = []
        self._system: list[Sample] = []
        self._numa: list[NumaSample] = []
        self._pods: dict[str, _PodAccumulator] = {}
        self._host_apps: dict[str, _HostAppAccumulator] = {}
        self._node_psi: list[PsiSample] = []

    @property
    def window_start(self) -> float | None:
        return self._start

    def add(self, tick: Tick, *, dropped_batches: int = 0) -> NodeMetricsReported | None:
        """Add one tick; returns the previous window's batch when this tick starts a new window."""
        start = window_start_of(tick.at, self.interval)
        finished = None
        if self._start is not None and start != self._start:
            finished = self.close(sent_at=tick.at, dropped_batches=dropped_batches)
        if self._start is None:
            self._start = start
        self._append(tick)
        return finished

    def due(self, now: float) -> bool:
        """True when `now` is past the end of a window that holds samples."""
        return self._start is not None and now >= self._start + self.interval

    def close(self, *, sent_at: float, dropped_batches: int = 0) -> NodeMetricsReported | None:
        """The batch of the current window (None if it holds nothing); the builder starts empty afterwards."""
        if self._start is None:
            return None
        start = self._start
        pods = [self._pods[uid] for uid in sorted(self._pods)]
        refs = [acc.pod for acc in pods]
        containers, container_samples = _container_columns(pods)
        batch = NodeMetricsReported(
            node=self.node,
            window_start=start,
            window_end=start + self.interval,
            sent_at=max(sent_at, start),
            node_samples=self._node,
            memory_with_page_cache=self._node_with_cache,
            memory_with_hot_page=self._node_with_hot_page,
            system_samples=self._system,
            numa_samples=self._numa,
            pods=refs,
            pod_samples=_pod_columns(pods),
            containers=containers,
            container_samples=container_samples,
            dropped_batches=dropped_batches,
            training=self.training.close(start + self.interval, refs),
            host_applications=[self._host_apps[name].batch_entry() for name in sorted(self._host_apps)],
            node_psi=self._node_psi,
        )
        pod_psi = [(i, sample) for i, acc in enumerate(pods) for sample in acc.psi]
        if pod_psi:  # left at the default otherwise, so that nothing goes on the wire
            batch = msgspec.structs.replace(batch, pod_psi=PodPsiColumns.of(pod_psi))
        pod_cpi = [
            PodCpiSample(pod=i, t=c.t, seconds=c.seconds, cycles=c.cycles, instructions=c.instructions)
            for i, acc in enumerate(pods)
            for c in acc.cpi
        ]
        if pod_cpi:  # as pod_psi: nothing on the wire without CPI
            batch = msgspec.structs.replace(batch, pod_cpi=pod_cpi)
        empty = not (self._node or self._system or self._pods or self._host_apps or self._node_psi)
        self._start, self._node, self._system, self._pods, self._numa = None, [], [], {}, []
        self._node_with_cache, self._node_with_hot_page, self._host_apps, self._node_psi = [], [], {}, []
        return None if empty else batch

    def _append(self, tick: Tick) -> None:
        self.training.add(tick)
        if tick.node is not None:
            self._node.append(tick.node)
            self._node_with_cache.append((tick.at, tick.node_memory_with_page_cache))
            # Like the page-cache variant, only beside a node sample, so the memory series share timestamps.
            if tick.node_memory_with_hot_page is not None:
                self._node_with_hot_page.append((tick.at, tick.node_memory_with_hot_page))
        if tick.system is not None:
            self._system.append(tick.system)
        self._numa.extend((tick.at, n.id, n.cpu, n.memory, n.system_cpu, n.system_memory) for n in tick.numa)
        if tick.node_psi is not None:
            self._node_psi.append(tick.node_psi)
        for ps in tick.pods:
            acc = self._pods.get(ps.pod.uid)
            if acc is None:
                acc = self._pods[ps.pod.uid] = _PodAccumulator(pod=ps.pod)
            acc.pod = ps.pod
            acc.samples.append(ps.sample, ps.memory_with_page_cache)
            if ps.psi is not None:
                acc.psi.append(ps.psi)
            if ps.cpi is not None:
                acc.cpi.append(ps.cpi)
            for cs in ps.containers:
                acc.containers.setdefault(cs.container_id, _Series()).append(cs.sample)
        for app in tick.host_apps:
            app_acc = self._host_apps.get(app.name)
            if app_acc is None:
                app_acc = self._host_apps[app.name] = _HostAppAccumulator(newest=app)
            app_acc.add(app)


class PodListThinner:
    """Leaves a batch's pod list out when the reader already has it: a 100-pod list is a third of a batch.

    Every batch gets the digest of its pod list (schemas.node.pod_list_digest; one already set is trusted); the
    list itself goes out when it differs from the previous batch's and at least every `resend_every` batches, so
    a reader that missed one (it started mid-stream, or the outbox dropped the batch that carried it) attributes
    pod rows again soon. One thinner per node: it remembers what that node sent last.
    """

    def __init__(self, resend_every: int) -> None:
        if resend_every < 1:
            raise ValueError(f"pod list resend period must be at least 1 batch, got {resend_every}")
        self.resend_every = resend_every
        self._last_digest = 0
        self._since_sent = 0

    def thin(self, batch: NodeMetricsReported) -> NodeMetricsReported:
        if not batch.pods:
            return batch
        digest = batch.pods_digest or pod_list_digest(batch.pods)
        self._since_sent += 1
        if digest == self._last_digest and self._since_sent < self.resend_every:
            return msgspec.structs.replace(batch, pods=[], pods_digest=digest)
        self._last_digest, self._since_sent = digest, 0
        return batch if batch.pods_digest else msgspec.structs.replace(batch, pods_digest=digest)


T = TypeVar("T")


class Outbox(Generic[T]):
    """Bounded FIFO of batches waiting for the bus: pushing past the bound drops the oldest and counts it."""

    def __init__(self, max_batches: int) -> None:
        if max_batches < 1:
            raise ValueError(f"outbox bound must be at least 1, got {max_batches}")
        self.max_batches = max_batches
        self._items: deque[T] = deque()
        self.dropped = 0
        """Batches dropped since the outbox was created."""

    def __len__(self) -> int:
        return len(self._items)

    def push(self, item: T) -> int:
        """Queue `item`; returns how many old items were dropped to make room (0 or 1)."""
        self._items.append(item)
        dropped = 0
        while len(self._items) > self.max_batches:
            self._items.popleft()
            dropped += 1
        self.dropped += dropped
        return dropped

    def peek(self) -> T | None:
        return self._items[0] if self._items else None

    def pop(self) -> T:
        return self._items.popleft()
