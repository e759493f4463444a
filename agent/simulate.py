"""Synthetic nodes with realistic co-location load, for `koordbus up --simulate-nodes N` and the ingest benchmark.

Pure and deterministic: a node's parameters come from its seed, and each window's noise from (seed, window),
so `batch(w)` returns the same samples whatever was asked before and in whatever order. Online (koord-prod,
LS/LSR) pods follow a 24 h sinusoid with noise; batch (koord-batch, BE) pods belong to a few jobs that run in
bursts, so pods appear and disappear with new UIDs each burst; node usage is Σ pods + system overhead and never
exceeds capacity (batch is squeezed first, as BE suppression would). Arrays are computed with numpy per
window; only the final lists are Python objects, which keeps one 100-pod batch well under a millisecond or two.
"""

from __future__ import annotations

import hashlib
import math
import uuid

import numpy as np
import numpy.typing as npt

from schemas import vocab
from schemas.node import (
    CPU_DTYPE,
    INDEX_DTYPE,
    MEMORY_DTYPE,
    TIME_DTYPE,
    NodeMetricsReported,
    PodRef,
    PodSampleColumns,
    Sample,
)

GiB = 1024**3
DAY = 86_400.0
_ONLINE_APPS = ("checkout", "search", "cart", "recommend", "gateway", "catalog", "profile", "payments")
_ONLINE_NAMESPACES = ("shop", "search", "platform")
_BATCH_JOBS = ("spark-etl", "flink-report", "ml-train", "log-compact")

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
    ) -> None:
        self.name = name
        self.seed = seed
        self.cpu_cores = cpu_cores
        self.memory_bytes = memory_bytes
        rng = np.random.default_rng(seed)
        n_online = round(pods * online_fraction)
        n_batch = pods - n_online
        self._init_online(rng, n_online)
        self._init_batch(rng, n_batch)
        self._sys_cpu = float(rng.uniform(0.3, 0.8))
        self._sys_mem = float(rng.uniform(2, 4)) * GiB
        self._page_cache = float(rng.uniform(0.05, 0.15)) * memory_bytes
        self._batch_refs: dict[tuple[int, int], PodRef] = {}

    def _init_online(self, rng: np.random.Generator, n: int) -> None:
        # Online pods together average ~35 % of the CPU and ~40 % of the memory, peaking mid-afternoon UTC.
        weights = rng.lognormal(0.0, 0.6, n)
        self._on_cpu = weights / max(weights.sum(), 1e-9) * 0.35 * self.cpu_cores
        mem_weights = rng.lognormal(0.0, 0.5, n)
        self._on_mem = mem_weights / max(mem_weights.sum(), 1e-9) * 0.40 * self.memory_bytes
        self._on_amp = rng.uniform(0.3, 0.6, n)
        self._on_peak = (14 + rng.normal(0, 1.5, n)) * 3600.0
        self._on_refs = [self._online_ref(rng, i) for i in range(n)]

    def _online_ref(self, rng: np.random.Generator, i: int) -> PodRef:
        app = _ONLINE_APPS[int(rng.integers(len(_ONLINE_APPS)))]
        template = _hash_hex(self.name, app, length=10)
        guaranteed = bool(rng.random() < 0.4)
        qos = vocab.QOS_LSR if guaranteed else vocab.QOS_LS
        return PodRef(
            uid=_uid(self.name, self.seed, "online", i),
            kube_qos=vocab.KUBE_QOS_GUARANTEED if guaranteed else vocab.KUBE_QOS_BURSTABLE,
            namespace=_ONLINE_NAMESPACES[i % len(_ONLINE_NAMESPACES)],
            name=f"{app}-{template}-{_hash_hex(self.name, i, length=5)}",
            priority=vocab.PRIORITY_RANGES[vocab.PRIORITY_PROD][2],
            labels={
                "app": app,
                "pod-template-hash": template,
                vocab.PRIORITY_CLASS_LABEL: vocab.PRIORITY_PROD,
                vocab.QOS_CLASS_LABEL: qos,
            },
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

    def _batch_ref(self, slot: int, incarnation: int) -> PodRef:
        ref = self._batch_refs.get((slot, incarnation))
        if ref is None:
            if len(self._batch_refs) > 8 * max(len(self._b_cpu), 1):
                self._batch_refs.clear()  # old incarnations are never asked for again in a forward-running sim
            job = _BATCH_JOBS[int(self._b_job[slot]) % len(_BATCH_JOBS)]
            ref = PodRef(
                uid=_uid(self.name, self.seed, "batch", slot, incarnation),
                kube_qos=vocab.KUBE_QOS_BESTEFFORT,
                namespace="batch",
                name=f"{job}-{incarnation % 100_000}-exec-{slot}",
                priority=vocab.PRIORITY_RANGES[vocab.PRIORITY_BATCH][2],
                labels={
                    "job": job,
                    vocab.PRIORITY_CLASS_LABEL: vocab.PRIORITY_BATCH,
                    vocab.QOS_CLASS_LABEL: vocab.QOS_BE,
                },
            )
            self._batch_refs[(slot, incarnation)] = ref
        return ref

    def batch(self, window_start: float, window_end: float) -> NodeMetricsReported:
        """The 1 s samples at whole seconds in [window_start, window_end), as the node's agent would report them."""
        t = np.arange(math.ceil(window_start), math.ceil(window_end), dtype=np.float64)
        rng = np.random.default_rng([self.seed, max(int(window_start), 0)])
        on_cpu, on_mem = self._online_usage(t, rng)
        b_cpu, b_mem, active, incarnation = self._batch_usage(t, rng)
        sys_cpu = np.clip(self._sys_cpu * (1 + 0.1 * rng.standard_normal(t.size)), 0.05, None)
        sys_mem = np.full(t.size, self._sys_mem)
        b_cpu, on_cpu = self._fit(b_cpu, on_cpu, self.cpu_cores - sys_cpu)
        b_mem, on_mem = self._fit(b_mem, on_mem, self.memory_bytes - sys_mem)
        node_cpu = on_cpu.sum(axis=0) + b_cpu.sum(axis=0) + sys_cpu
        node_mem = on_mem.sum(axis=0) + b_mem.sum(axis=0) + sys_mem
        times = t.tolist()
        runs = self._online_runs() + self._batch_runs(active, incarnation)
        runs.sort(key=lambda run: run.pod.uid)
        pod_samples = _columns(runs, t, np.vstack((on_cpu, b_cpu)), np.vstack((on_mem, b_mem)))
        with_cache = np.minimum(node_mem + self._page_cache, self.memory_bytes).astype(np.int64).tolist()
        return NodeMetricsReported(
            node=self.name,
            window_start=window_start,
            window_end=window_end,
            sent_at=window_end,
            node_samples=_samples(times, node_cpu, node_mem),
            memory_with_page_cache=list(zip(times, with_cache, strict=True)),
            system_samples=_samples(times, sys_cpu, sys_mem),
            pods=[run.pod for run in runs],
            pod_samples=pod_samples,
        )

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
        cpu = self._b_cpu[:, None] * np.clip(0.8 + 0.2 * rng.standard_normal((n, t.size)), 0.1, 1.2) * active
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

    def _online_runs(self) -> list[_Run]:
        return [_Run(ref, row) for row, ref in enumerate(self._on_refs)]

    def _batch_runs(self, active: npt.NDArray[np.bool_], incarnation: npt.NDArray[np.int64]) -> list[_Run]:
        """One run per executor incarnation with samples in the window; rows follow the online rows."""
        runs: list[_Run] = []
        if not active.shape[1]:
            return runs
        offset = len(self._on_refs)
        steady = active.all(axis=1) & (incarnation.min(axis=1) == incarnation.max(axis=1))
        for slot in np.flatnonzero(active.any(axis=1)).tolist():
            if steady[slot]:  # the common case: one executor running through the whole window
                runs.append(_Run(self._batch_ref(slot, int(incarnation[slot, 0])), offset + slot))
                continue
            for inc in np.unique(incarnation[slot][active[slot]]).tolist():
                mask = active[slot] & (incarnation[slot] == inc)
                runs.append(_Run(self._batch_ref(slot, inc), offset + slot, mask))
        return runs


class _Run:
    """The samples of one pod in a window: a row of the usage matrices, all of it or the columns in `mask`."""

    __slots__ = ("mask", "pod", "row")

    def __init__(self, pod: PodRef, row: int, mask: npt.NDArray[np.bool_] | None = None) -> None:
        self.pod, self.row, self.mask = pod, row, mask


def _columns(runs: list[_Run], t: FloatArray, cpu: FloatArray, mem: FloatArray) -> PodSampleColumns:
    """Pod sample columns in `runs` order, gathered from the (pods × seconds) matrices with one fancy index."""
    if not runs or not t.size:
        return PodSampleColumns()
    full = np.ones(t.size, dtype=bool)
    masks = np.stack([full if run.mask is None else run.mask for run in runs])
    pod_index, second = np.nonzero(masks)  # row-major: runs in order, seconds ascending within a run
    rows = np.array([run.row for run in runs], dtype=np.int64)[pod_index]
    # packed from the arrays directly (the columns' little-endian types), far faster than through Python lists
    return PodSampleColumns(
        pod=pod_index.astype(INDEX_DTYPE).tobytes(),
        t=t[second].astype(TIME_DTYPE).tobytes(),
        cpu=cpu[rows, second].astype(CPU_DTYPE).tobytes(),
        memory=mem[rows, second].astype(MEMORY_DTYPE).tobytes(),
    )


def _samples(times: list[float], cpu: FloatArray, mem: FloatArray) -> list[Sample]:
    return list(zip(times, cpu.tolist(), mem.astype(np.int64).tolist(), strict=True))
