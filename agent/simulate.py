"""Synthetic nodes with realistic co-location load, for `koordbus up --simulate-nodes N` and the ingest benchmark.

A simulated node speaks the real agent's dialect and nothing more: it makes what the real collector and sampler
make (per-second node and system samples, pod samples keyed by pod UID and the cgroup's kube QoS) and what the
kubelet lists (`kubelet_pods`: Kubernetes Pod objects with metadata, spec and status), and its batch is built by
the agent's own BatchBuilder after the agent's own pod-identity join (agent.batch.attribute_pods).

Deterministic: a node's parameters come from its seed, and each window's noise from (seed, window), so with the
loop open `batch(w)` returns the same samples whatever was asked before and in whatever order. The batch that ends a
minute carries the prod predictor's training round over that minute, complete when the minute's windows were asked
in order (as a running simulation asks them). Online (koord-prod,
LS/LSR) pods follow a 24 h sinusoid with noise; batch (koord-batch, BE) pods belong to a few jobs that run in
bursts, so pods appear and disappear with new UIDs each burst; node usage is Σ pods + system overhead and never
exceeds capacity (batch is squeezed first, as BE suppression would). With the loop closed
(`set_batch_allocatable`, fed by koordbus.simulation from NodeResourceComputed) batch pods are placed only within
the node's batch allocatable and evicted when it shrinks (`place_batch_pods`, pure), as koord-scheduler and
koordlet would do; each eviction is the PodEvictionRequested a real agent would publish for it
(`last_evictions`, built by agent.evict.eviction_request and published by koordbus.simulation as the agent does).
A node's online pods (each with its ReplicaSet) average `online_share` of its CPU, peaking at `peak_hour` UTC (a hot
node's services request at most 90 % of it and use more, as Burstable pods); `pods()` lists its non-batch pods as
the API server would, `add_pod` runs a pod scheduled onto it with its usage profile (agent.simulate_pods) and
`remove_pod` stops one that finished or was evicted (koordbus.simcluster); `last_second` keeps the latest window's
last second and `last_node_cpu` its node CPU samples for the QoS loops (agent.simulate_qos). A few stateless online
services (`EVICTABLE_APPS`) carry `koordinator.sh/eviction-enabled: "true"`, as pods that opt in to Koordinator's
priority-based eviction do, so a hot node's cpu-evict loop has pods it may pick.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections.abc import Sequence
from typing import NamedTuple

import msgspec
import numpy as np
import numpy.typing as npt

from agent import evict, simulate_pods
from agent.actuate import NodePod
from agent.batch import BatchBuilder, PodIdentities, TrainingAccumulator, attribute_pods
from agent.core import PodSample, Tick
from schemas import kube, vocab
from schemas.node import NodeMetricsReported, PodRef
from schemas.qos import PodEvictionRequested

GiB = 1024**3
DAY = 86_400.0
_ONLINE_APPS = ("checkout", "search", "cart", "recommend", "gateway", "catalog", "profile", "payments")
_ONLINE_NAMESPACES = ("shop", "search", "platform")
EVICTABLE_APPS = frozenset({"recommend", "catalog"})
"""Stateless online services that opt in to Koordinator's priority-based eviction (label
`koordinator.sh/eviction-enabled: "true"`): MemoryEvict and CPUEvict may pick them on a node past its threshold."""
_BATCH_JOBS = ("spark-etl", "flink-report", "ml-train", "log-compact")
ONLINE_REQUEST_CAP = 0.9
"""The online pods a node starts with request at most this share of its CPU."""

FloatArray = npt.NDArray[np.float64]


def simulated_node_names(n: int) -> list[str]:
    """sim-node-0001 … sim-node-<n> (wider numbers past 9999)."""
    return [f"sim-node-{i:04d}" for i in range(1, n + 1)]


def _hash_hex(*parts: object, length: int = 10) -> str:
    return hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=16).hexdigest()[:length]


def _uid(*parts: object) -> str:
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=16).digest()
    return str(uuid.UUID(bytes=digest, version=4))


class SimulatedNode:
    """One synthetic node; `batch()` gives the NodeMetricsReported its agent would publish for a window."""

    def __init__(
        self,
        name: str,
        seed: int,
        *,
        cpu_cores: float = 32.0,
        memory_bytes: int = 128 * GiB,
        pods: int = 40,
        online_fraction: float = 0.6,
        online_share: float = 0.35,
        peak_hour: float = 14.0,
    ) -> None:
        self.name = name
        self.seed = seed
        self.cpu_cores = cpu_cores
        self.memory_bytes = memory_bytes
        rng = np.random.default_rng(seed)
        n_online = round(pods * online_fraction)
        n_batch = pods - n_online
        self._scheduled: dict[str, tuple[NodePod, simulate_pods.UsageProfile]] = {}
        """Pods scheduled onto the node after its start (koordbus.simcluster), by UID, oldest first."""
        self._removed: set[int] = set()
        """The online pods (by row) a migration moved away."""
        self._init_online(rng, n_online, share=online_share, peak_hour=peak_hour)
        self._init_batch(rng, n_batch)
        self._sys_cpu = float(rng.uniform(0.3, 0.8))
        self._sys_mem = float(rng.uniform(2, 4)) * GiB
        self._page_cache = float(rng.uniform(0.05, 0.15)) * memory_bytes
        self._batch_pods: dict[int, dict[int, NodePod]] = {}
        """Per batch slot, its pods by incarnation: the latest two (a window may span a slot's new incarnation; an
        older one is never asked for again in a forward-running simulation)."""
        self._identities = PodIdentities(())
        """The batch entries of the pods listed in the last window (agent.batch.PodIdentities), kept across windows."""
        self._training = TrainingAccumulator()
        """The agent's training round spans batches: a long-lived accumulator, like the real agent's builder's."""
        self._batch_allocatable: tuple[float, int] | None = None
        self._running: dict[tuple[int, int], None] = {}
        """Batch pods placed (with the loop closed), oldest first: the order they are kept in when room shrinks."""
        self._evicted: set[tuple[int, int]] = set()
        self.last_second: tuple[Tick | None, list[NodePod]] = (None, [])
        """The latest window's last second and the pods listed in it: what the QoS loops read (agent.simulate_qos)."""
        self.last_node_cpu: tuple[tuple[float, int], ...] = ()
        """The latest window's node CPU samples, (time, millicores) each second: what CPUEvict averages."""
        self.last_evictions: tuple[PodEvictionRequested, ...] = ()
        """The eviction requests of the batch pods the latest window's placement evicted (with the loop closed)."""

    def _init_online(self, rng: np.random.Generator, n: int, *, share: float, peak_hour: float) -> None:
        # Online pods together average `share` of the CPU (~35 %) and ~40 % of the memory, peaking at `peak_hour` UTC
        # (mid-afternoon).
        weights = rng.lognormal(0.0, 0.6, n)
        self._on_cpu = weights / max(weights.sum(), 1e-9) * share * self.cpu_cores
        mem_weights = rng.lognormal(0.0, 0.5, n)
        self._on_mem = mem_weights / max(mem_weights.sum(), 1e-9) * 0.40 * self.memory_bytes
        self._on_amp = rng.uniform(0.3, 0.6, n)
        self._on_peak = (peak_hour + rng.normal(0, 1.5, n)) * 3600.0
        # Requests never add up past ONLINE_REQUEST_CAP of the node: a busier node's services request less than
        # they use at their peak (Burstable pods, no limits), as pods do on the nodes load-aware scheduling is for.
        wanted = sum(self._wanted_cpu_request(i) for i in range(n))
        scale = min(1.0, ONLINE_REQUEST_CAP * self.cpu_cores / wanted) if wanted > 0 else 1.0
        self._on_pods = [self._online_pod(rng, i, request_scale=scale) for i in range(n)]

    def _headroom(self, i: int) -> float:
        # Drawn from a hash, not `rng`, so the draws that follow (and so every other number of the node) stay as
        # they were.
        return int(_hash_hex(self.name, "headroom", i, length=8), 16) / 16**8

    def _wanted_cpu_request(self, i: int) -> float:
        """Online services request for their daily peak with headroom (1.2–2× the peak CPU), which is the room the
        prod predictor finds for mid pods."""
        peak_cpu = float(self._on_cpu[i]) * (1 + float(self._on_amp[i]))
        return peak_cpu * (1.2 + 0.8 * self._headroom(i))

    def _online_pod(self, rng: np.random.Generator, i: int, *, request_scale: float) -> NodePod:
        app = _ONLINE_APPS[int(rng.integers(len(_ONLINE_APPS)))]
        template = _hash_hex(self.name, app, length=10)
        guaranteed = bool(rng.random() < 0.4) and request_scale >= 1.0
        headroom = self._headroom(i)
        cpu = f"{max(round(self._wanted_cpu_request(i) * request_scale * 1000), 1)}m"
        memory = str(int(self._on_mem[i] * (1.1 + 0.4 * headroom)))
        resources = kube.ResourceRequirements(
            requests={"cpu": cpu, "memory": memory}, limits={"cpu": cpu, "memory": memory} if guaranteed else None
        )
        namespace = _ONLINE_NAMESPACES[i % len(_ONLINE_NAMESPACES)]
        replica_set = f"{app}-{template}"
        return _node_pod(
            uid=_uid(self.name, self.seed, "online", i),
            namespace=namespace,
            name=f"{replica_set}-{_hash_hex(self.name, i, length=5)}",
            node=self.name,
            owner=kube.OwnerReference(
                api_version="apps/v1",
                kind="ReplicaSet",
                name=replica_set,
                uid=_uid("replicaset", namespace, replica_set),
                controller=True,
            ),
            labels={
                "app": app,
                "pod-template-hash": template,
                vocab.PRIORITY_CLASS_LABEL: vocab.PRIORITY_PROD,
                vocab.QOS_CLASS_LABEL: vocab.QOS_LSR if guaranteed else vocab.QOS_LS,
                **({evict.EVICTION_ENABLED: "true"} if app in EVICTABLE_APPS else {}),
            },
            priority_class=vocab.PRIORITY_PROD,
            container=kube.Container(name=app, resources=resources),
            qos=vocab.KUBE_QOS_GUARANTEED if guaranteed else vocab.KUBE_QOS_BURSTABLE,
        )

    def _init_batch(self, rng: np.random.Generator, n: int) -> None:
        # Slots belong to a few jobs; a job's slots share its period and phase, so executors come and go together.
        jobs = max(1, min(len(_BATCH_JOBS), n // 5 or 1))
        job_period = rng.uniform(1800, 7200, jobs)
        job_offset = rng.uniform(0, job_period)
        job_duty = rng.uniform(0.3, 0.7, jobs)
        self._b_job = rng.integers(0, jobs, n) if n else np.zeros(0, dtype=np.int64)
        self._b_period = job_period[self._b_job]
        self._b_offset = job_offset[self._b_job] + rng.uniform(0, 60, n)  # executors start within a minute
        self._b_duty = job_duty[self._b_job]
        # All executors at once would want ~70 % of the CPU and ~40 % of the memory; duty cycles halve that.
        cpu_weights, mem_weights = rng.uniform(1.0, 4.0, n), rng.uniform(1.0, 8.0, n)
        self._b_cpu = cpu_weights / max(cpu_weights.sum(), 1e-9) * 0.7 * self.cpu_cores
        self._b_mem = mem_weights / max(mem_weights.sum(), 1e-9) * 0.4 * self.memory_bytes

    def batch_request(self, slot: int) -> tuple[float, int]:
        """(cores, bytes) an executor of `slot` requests as batch-cpu and batch-memory: the most it ever uses, in
        whole millicores as its pod declares it."""
        return math.ceil(float(self._b_cpu[slot]) * _BATCH_CPU_PEAK * 1000) / 1000, int(self._b_mem[slot])

    def _batch_pod(self, slot: int, incarnation: int) -> NodePod:
        incarnations = self._batch_pods.setdefault(slot, {})
        pod = incarnations.get(incarnation)
        if pod is None:
            job = _BATCH_JOBS[int(self._b_job[slot]) % len(_BATCH_JOBS)]
            cpu, memory = self.batch_request(slot)
            amounts: dict[str, str | int | float] = {
                vocab.BATCH_CPU: str(round(cpu * 1000)),
                vocab.BATCH_MEMORY: str(memory),
            }
            pod = incarnations[incarnation] = _node_pod(
                uid=_uid(self.name, self.seed, "batch", slot, incarnation),
                namespace="batch",
                name=f"{job}-{incarnation % 100_000}-exec-{slot}",
                node=self.name,
                labels={
                    "job": job,
                    vocab.PRIORITY_CLASS_LABEL: vocab.PRIORITY_BATCH,
                    vocab.QOS_CLASS_LABEL: vocab.QOS_BE,
                },
                priority_class=vocab.PRIORITY_BATCH,
                container=kube.Container(
                    name="executor", resources=kube.ResourceRequirements(requests=amounts, limits=amounts)
                ),
                qos=vocab.KUBE_QOS_BESTEFFORT,
            )
            if len(incarnations) > 2:
                del incarnations[min(incarnations)]
        return pod

    def pods(self) -> list[NodePod]:
        """The non-batch pods running on the node (its online pods not moved away, then those scheduled onto it),
        as the API server lists them: what koordbus.simcluster publishes as the Kubernetes bridge would."""
        online = [pod for row, pod in enumerate(self._on_pods) if row not in self._removed]
        return [*online, *(pod for pod, _ in self._scheduled.values())]

    def add_pod(self, pod: NodePod, profile: simulate_pods.UsageProfile) -> None:
        """A pod bound to this node: from the next window it runs here, using what `profile` says."""
        self._scheduled[pod.uid] = (pod, profile)

    def remove_pod(self, uid: str) -> simulate_pods.UsageProfile | None:
        """The pod stops running here (it finished, or was evicted); returns how it used the node (None: no such
        pod), so a replacement elsewhere can use the same."""
        if (scheduled := self._scheduled.pop(uid, None)) is not None:
            return scheduled[1]
        for row, pod in enumerate(self._on_pods):
            if pod.uid == uid and row not in self._removed:
                self._removed.add(row)
                cpu, memory = float(self._on_cpu[row]), float(self._on_mem[row])
                return simulate_pods.UsageProfile(cpu, memory, float(self._on_amp[row]), float(self._on_peak[row]))
        return None

    @property
    def batch_allocatable(self) -> tuple[float, int] | None:
        """(cores, bytes) batch pods run within; None while the loop is open (they run as they come)."""
        return self._batch_allocatable

    def set_batch_allocatable(self, cpu_cores: float, memory_bytes: int) -> None:
        """Close the loop: from the next window batch pods run only within this batch allocatable."""
        self._batch_allocatable = (max(cpu_cores, 0.0), max(memory_bytes, 0))

    def batch(self, window_start: float, window_end: float) -> NodeMetricsReported:
        """The batch the node's agent would publish for [window_start, window_end) (samples at whole seconds)."""
        return self.agent_batch(window_start, window_end)[0]

    def agent_batch(self, window_start: float, window_end: float) -> tuple[NodeMetricsReported, list[NodePod]]:
        """The batch, and the kubelet's pod list it was joined with: the agent's builder over synthetic ticks."""
        builder = BatchBuilder(self.name, interval=window_end - window_start, training=self._training)
        ticks, listed = self.ticks(window_start, window_end)
        self.last_second = (ticks[-1] if ticks else None), listed
        self.last_node_cpu = tuple((t.node[0], int(t.node[1] * 1000)) for t in ticks if t.node is not None)
        identities = self._identities = self._identities.relisted(listed)
        for tick in ticks:
            if builder.add(msgspec.structs.replace(tick, pods=attribute_pods(tick.pods, identities))) is not None:
                raise ValueError(f"window [{window_start}, {window_end}) is not aligned to a multiple of its length")
        batch = builder.close(sent_at=window_end)
        if batch is None:
            raise ValueError(f"window [{window_start}, {window_end}) holds no whole second")
        return batch, listed

    def ticks(self, window_start: float, window_end: float) -> tuple[list[Tick], list[NodePod]]:
        """What the real collector and sampler give each second of the window (pods by UID and cgroup QoS only),
        and the kubelet's pod list: the pods running on the node in the window."""
        t = np.arange(math.ceil(window_start), math.ceil(window_end), dtype=np.float64)
        rng = np.random.default_rng([self.seed, max(int(window_start), 0)])
        on_cpu, on_mem = self._online_usage(t, rng)
        b_cpu, b_mem, active, incarnation = self._batch_usage(t, rng)
        if self._removed:
            gone = sorted(self._removed)
            on_cpu[gone], on_mem[gone] = 0.0, 0.0
        if self._scheduled:  # their own noise, so the online and batch draws stay as they were
            s_cpu, s_mem = simulate_pods.usage(
                [profile for _, profile in self._scheduled.values()],
                t,
                np.random.default_rng([self.seed, max(int(window_start), 0), 1]),
            )
            on_cpu, on_mem = np.vstack((on_cpu, s_cpu)), np.vstack((on_mem, s_mem))
        if self._batch_allocatable is not None:
            admitted = self._admit(active, incarnation, at=window_start)
            active &= admitted
            b_cpu, b_mem = b_cpu * admitted, b_mem * admitted
        sys_cpu = np.clip(self._sys_cpu * (1 + 0.1 * rng.standard_normal(t.size)), 0.05, None)
        sys_mem = np.full(t.size, self._sys_mem)
        b_cpu, on_cpu = self._fit(b_cpu, on_cpu, self.cpu_cores - sys_cpu)
        b_mem, on_mem = self._fit(b_mem, on_mem, self.memory_bytes - sys_mem)
        node_cpu = (on_cpu.sum(axis=0) + b_cpu.sum(axis=0) + sys_cpu).tolist()
        node_mem = (on_mem.sum(axis=0) + b_mem.sum(axis=0) + sys_mem).astype(np.int64).tolist()
        with_cache = np.minimum(np.array(node_mem) + self._page_cache, self.memory_bytes).astype(np.int64).tolist()
        sys_cpu_l, sys_mem_l = sys_cpu.tolist(), sys_mem.astype(np.int64).tolist()
        cpu, mem = np.vstack((on_cpu, b_cpu)).T.tolist(), np.vstack((on_mem, b_mem)).astype(np.int64).T.tolist()
        rows = [*self._on_pods, *(pod for pod, _ in self._scheduled.values())]
        running = [(row, _measured(p)) for row, p in enumerate(rows) if row not in self._removed]
        offset = len(rows)
        listed = {rows[row].uid: rows[row] for row, _ in running}
        ticks: list[Tick] = []
        for k, at in enumerate(t.tolist()):
            cpu_k, mem_k = cpu[k], mem[k]
            pods = [_sample(ref, at, cpu_k[row], mem_k[row]) for row, ref in running]
            for slot in np.flatnonzero(active[:, k]).tolist():
                node_pod = self._batch_pod(slot, int(incarnation[slot, k]))
                listed[node_pod.uid] = node_pod
                row = offset + slot
                pods.append(_sample(_measured(node_pod), at, cpu_k[row], mem_k[row]))
            ticks.append(
                Tick(
                    at=at,
                    node=(at, node_cpu[k], node_mem[k]),
                    node_memory_with_page_cache=with_cache[k],
                    system=(at, sys_cpu_l[k], sys_mem_l[k]),
                    pods=tuple(pods),
                )
            )
        return ticks, list(listed.values())

    def _admit(
        self, active: npt.NDArray[np.bool_], incarnation: npt.NDArray[np.int64], *, at: float
    ) -> npt.NDArray[np.bool_]:
        """Which (slot, second) cells run, deciding once at the window's start (`at`): executors wanting to run in it
        are placed within the batch allocatable, running ones that no longer fit are evicted (for good), each with
        its eviction request in `last_evictions`."""
        assert self._batch_allocatable is not None
        wanted: dict[tuple[int, int], None] = {}
        for k in range(active.shape[1]):
            for slot in np.flatnonzero(active[:, k]).tolist():
                wanted[(slot, int(incarnation[slot, k]))] = None
        uid_of = {key: self._batch_pod(*key).uid for key in wanted}
        key_of = {uid: key for key, uid in uid_of.items()}

        def demand(key: tuple[int, int]) -> BatchDemand:
            cpu, memory = self.batch_request(key[0])
            return BatchDemand(uid=uid_of[key], cpu=cpu, memory=memory)

        running = [demand(key) for key in self._running if key in wanted]
        candidates = [demand(key) for key in wanted if key not in self._running and key not in self._evicted]
        placement = place_batch_pods(self._batch_allocatable, running=running, candidates=candidates)
        self._running = {key_of[uid]: None for uid in (*placement.kept, *placement.placed)}
        evicted = {key_of[e.uid] for e in placement.evicted}
        self._evicted = {key for key in self._evicted if key in wanted} | evicted
        self.last_evictions = tuple(
            evict.eviction_request(
                node=self.name, at=at, pod=self._batch_pod(*key_of[e.uid]), feature=e.feature, reason=e.reason
            )
            for e in placement.evicted
        )
        admitted = np.zeros(active.shape, dtype=bool)
        for slot, inc in self._running:
            admitted[slot] |= incarnation[slot] == inc
        return admitted

    def _online_usage(self, t: FloatArray, rng: np.random.Generator) -> tuple[FloatArray, FloatArray]:
        n = self._on_cpu.size
        diurnal = 1 + self._on_amp[:, None] * np.cos(2 * np.pi * (t[None, :] - self._on_peak[:, None]) / DAY)
        cpu = self._on_cpu[:, None] * diurnal * (1 + 0.08 * rng.standard_normal((n, t.size)))
        mem = self._on_mem[:, None] * (0.9 + 0.1 * diurnal / 1.6) * (1 + 0.005 * rng.standard_normal((n, t.size)))
        return np.clip(cpu, 0.001, None), np.clip(mem, 0, None)

    def _batch_usage(
        self, t: FloatArray, rng: np.random.Generator
    ) -> tuple[FloatArray, FloatArray, npt.NDArray[np.bool_], npt.NDArray[np.int64]]:
        n = self._b_cpu.size
        phase = t[None, :] + self._b_offset[:, None]
        incarnation = np.floor(phase / self._b_period[:, None]).astype(np.int64)
        active = (phase - incarnation * self._b_period[:, None]) < self._b_duty[:, None] * self._b_period[:, None]
        noise = np.clip(0.8 + 0.2 * rng.standard_normal((n, t.size)), 0.1, _BATCH_CPU_PEAK)
        cpu = self._b_cpu[:, None] * noise * active
        # Memory ramps up over the first minutes of a burst, as executors fill their caches.
        age = phase - incarnation * self._b_period[:, None]
        mem = self._b_mem[:, None] * np.clip(age / 300.0, 0.1, 1.0) * active
        return cpu, mem, active, incarnation

    @staticmethod
    def _fit(batch: FloatArray, online: FloatArray, room: FloatArray) -> tuple[FloatArray, FloatArray]:
        """Scale batch, then (only if needed) online usage so Σ stays within `room` at every instant."""
        on_sum = online.sum(axis=0)
        online_scale = np.minimum(1.0, np.maximum(room, 0) / np.maximum(on_sum, 1e-9))
        online = online * online_scale
        b_room = np.maximum(room - online.sum(axis=0), 0)
        b_scale = np.minimum(1.0, b_room / np.maximum(batch.sum(axis=0), 1e-9))
        return batch * b_scale * 0.999, online * 0.999


_BATCH_CPU_PEAK = 1.2
"""An executor uses at most this many times its mean CPU; it requests that much batch-cpu."""


class BatchDemand(NamedTuple):
    """A batch pod's request: cores of batch-cpu and bytes of batch-memory."""

    uid: str
    cpu: float
    memory: int


class BatchEviction(NamedTuple):
    """A running batch pod that no longer fits: by which of Koordinator's allocatable-eviction features, and why."""

    uid: str
    feature: str
    reason: str


class BatchPlacement(NamedTuple):
    kept: tuple[str, ...]
    """Running pods that still fit, in their order."""
    placed: tuple[str, ...]
    """Candidates that fit after them, in their order (the others stay pending)."""
    evicted: tuple[BatchEviction, ...]
    """Running pods that no longer fit."""


def place_batch_pods(
    allocatable: tuple[float, int], *, running: Sequence[BatchDemand], candidates: Sequence[BatchDemand]
) -> BatchPlacement:
    """Which batch pods run within `allocatable` (cores, bytes): running pods are kept oldest first while their
    requests fit (the rest are evicted, as koordlet's CPUAllocatableEvict / MemoryAllocatableEvict evict batch pods
    past the node's batch resources; the reason names the numbers), then candidates are placed in order while they
    fit (as koord-scheduler places pods requesting batch resources)."""
    milli = round(allocatable[0] * 1000)  # in whole millicores, as batch-cpu is declared: no float drift
    cpu_left, memory_left = milli, allocatable[1]
    kept: list[str] = []
    evicted: list[BatchEviction] = []
    placed: list[str] = []
    for pod in running:
        cpu = round(pod.cpu * 1000)
        if cpu <= cpu_left and pod.memory <= memory_left:
            kept.append(pod.uid)
            cpu_left, memory_left = cpu_left - cpu, memory_left - pod.memory
        elif cpu > cpu_left:
            reason = (
                f"batch-cpu request {cpu}m > {cpu_left}m left = batch allocatable {milli}m − {milli - cpu_left}m "
                f"requested by the older pods kept"
            )
            evicted.append(BatchEviction(uid=pod.uid, feature=evict.CPU_ALLOCATABLE, reason=reason))
        else:
            reason = (
                f"batch-memory request {pod.memory} > {memory_left} left = batch allocatable {allocatable[1]} "
                f"− {allocatable[1] - memory_left} requested by the older pods kept (bytes)"
            )
            evicted.append(BatchEviction(uid=pod.uid, feature=evict.MEMORY_ALLOCATABLE, reason=reason))
    for pod in candidates:
        cpu = round(pod.cpu * 1000)
        if cpu <= cpu_left and pod.memory <= memory_left:
            placed.append(pod.uid)
            cpu_left, memory_left = cpu_left - cpu, memory_left - pod.memory
    return BatchPlacement(kept=tuple(kept), placed=tuple(placed), evicted=tuple(evicted))


def _node_pod(
    *,
    uid: str,
    namespace: str,
    name: str,
    node: str,
    labels: dict[str, str],
    priority_class: str,
    container: kube.Container,
    qos: str,
    owner: kube.OwnerReference | None = None,
) -> NodePod:
    """A running pod as the kubelet's /pods lists it."""
    return NodePod(
        pod=kube.Pod(
            metadata=kube.ObjectMeta(
                name=name,
                namespace=namespace,
                uid=uid,
                labels=labels,
                owner_references=[owner] if owner is not None else [],
            ),
            spec=kube.PodSpec(
                node_name=node,
                scheduler_name="koord-scheduler",
                priority=vocab.PRIORITY_RANGES[priority_class][2],
                priority_class_name=priority_class,
                containers=[container],
            ),
            status=kube.PodStatus(phase=kube.PHASE_RUNNING, qos_class=qos),
        )
    )


def _measured(pod: NodePod) -> PodRef:
    """What the cgroup path tells of a pod: its UID and kube QoS."""
    return PodRef(uid=pod.uid, kube_qos=pod.pod.status.qos_class)


def _sample(ref: PodRef, at: float, cpu: float, memory: int) -> PodSample:
    # no page cache is modelled per pod: memory with page cache is the memory
    return PodSample(pod=ref, sample=(at, cpu, memory), memory_with_page_cache=memory)
