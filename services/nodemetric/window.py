"""A node's streaming window: bounded numpy state fed with agent batches, and the reports it yields.

Callers: services/nodemetric/service.py feeds each node's NodeMetricsReported batches into a `NodeWindow`,
asks `due_report` when a report round is due and publishes `compute_status`.

The report at T covers [T − w, T): the sample at exactly T belongs to the batch [T, T + interval), and a report
must not depend on whether that batch had arrived when it was computed, or replays would differ.

Memory model (10,000 nodes share one process, so every node's state is kept small):
- Node and system samples are kept raw in numpy columns bounded by the longest window plus one report interval,
  so percentiles are exact. Of the node memory variants only the one the collect policy reads is kept.
- Pod samples are kept as buckets: per pod, count, sums, first and last sample time. Consecutive batches that
  fall in the same chunk of the report grid (chunks of gcd(report interval, aggregate duration) seconds,
  starting at the node's report phase) merge into one bucket per pod, so a 5-minute window holds a handful
  of buckets per pod rather than one per batch. Every report window is a union of whole chunks, so this is
  exact when batches fall on chunk boundaries — the agent cuts batches on multiples of its publish interval,
  which divides the report grid — and otherwise it leaves out the batch straddling each window edge.
- Pod memory under usageWithHotPageCache uses the without-page-cache samples: agents report no per-pod
  hot-page series.
- Host application samples are bucketed as pods' are (services.nodemetric.hostapps), in state made only for
  nodes that report host applications; so are PSI stall ratios (services.nodemetric.psi), only for nodes that
  report PSI. The tables are services.nodemetric.tables'.
Pods are known by the batch's pod list. A batch may leave the list out and name it by digest instead (see
schemas.node.NodeMetricsReported.pods_digest); the window remembers the last few lists it was sent, and the
pod rows of a batch whose list it does not hold are dropped and counted (`unattributed_batches`).
podsMetric names the pods of the newest batch's list only, as koordlet reports only the pods the kubelet lists now
(§1.6 item 5): a pod that left the node (evicted, finished) drops out of the next report instead of lingering, its
average still counted, for an aggregate window (which made batch used exceed the batch allocatable for 5 minutes
after every eviction).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import numpy.typing as npt

from schemas import koordinator, node, psi, vocab
from schemas.resources import CPU, MEMORY
from services.nodemetric.core import (
    HostAppBuckets,
    PodBuckets,
    PodInfo,
    Series,
    Sources,
    Span,
    WindowCount,
    assemble_status,
    count_windows,
    effective_policy,
    retention_seconds,
    sample_rows,
)
from services.nodemetric.hostapps import HostApps
from services.nodemetric.psi import PsiBuckets
from services.nodemetric.tables import F4, F8, I8, ChunkBuckets, Table

_NO_PODS: npt.NDArray[np.int64] = np.empty(0, np.int64)
_COMPACTION_PERIOD_SECONDS = 60.0  # expired rows linger at most this long (plus one batch)
_SERIES_SLACK_ROWS = 96  # room for a compaction period and a few batches on top of a full window at 1 sample/s
_POD_TABLE_INITIAL_ROWS = 128
_POD_LISTS_REMEMBERED = 4  # pod lists a node may refer to by digest (older ones cover batches arriving late)
_F8, _I8 = F8, I8
# Node and system samples share one time column: agents take both at the same instants. Where a batch's two
# series differ in time, each gets rows of its own with NaN in the other's columns.
_SERIES_COLUMNS: dict[str, np.dtype[Any]] = {"t": _F8, "cpu": _F8, "mem": _F8, "sys_cpu": _F8, "sys_mem": _F8}
_MEMORY_COLUMNS: dict[str, np.dtype[Any]] = {"t": _F8, "mem": _F8}
# One row per batch and NUMA node: the sums of its samples, averaged over the batches inside the aggregate window.
_NUMA_COLUMNS: dict[str, np.dtype[Any]] = {
    "t_min": _F8,
    "t_max": _F8,
    "numa": _I8,
    "count": _F8,
    "cpu": _F8,
    "mem": _F8,
    "sys_cpu": _F8,
    "sys_mem": _F8,
}
_NUMA_TABLE_INITIAL_ROWS = 16


class _HeldBatches:
    """Window starts of the batches a window holds, so a redelivered batch is not counted twice.

    A float64 array rather than a dict: the longest window holds ~190 batches per node, and 10,000 nodes'
    worth of dict entries and float objects would cost more than their samples.
    """

    def __init__(self) -> None:
        self._starts = np.empty(32, _F8)
        self._ends = np.empty(32, _F8)
        self._size = 0

    def __contains__(self, window_start: float) -> bool:
        return bool((self._starts[: self._size] == window_start).any())

    def add(self, window_start: float, window_end: float) -> None:
        if self._size == self._starts.size:
            self._starts = np.concatenate((self._starts, np.empty(self._size, _F8)))
            self._ends = np.concatenate((self._ends, np.empty(self._size, _F8)))
        self._starts[self._size], self._ends[self._size] = window_start, window_end
        self._size += 1

    def expire(self, cutoff: float) -> None:
        """Forget batches that ended at or before `cutoff`."""
        keep = self._ends[: self._size] > cutoff
        kept = int(keep.sum())
        if kept < self._size:
            self._starts[:kept] = self._starts[: self._size][keep]
            self._ends[:kept] = self._ends[: self._size][keep]
            self._size = kept


def _pod_info(ref: node.PodRef, uid: str) -> PodInfo:
    """The pod as the agent named it from the kubelet's list: namespace/name, and Koordinator's classes from its
    labels and spec.priority exactly as koordlet computes them (spec §0: PriorityClassWithDefault,
    QoSClassWithDefault; the kube QoS only where those leave it open).

    A pod the agent knows only by uid (its cgroup appeared before the kubelet listed it, or the agent has no kubelet
    URL) is reported as namespace "" and name = uid, its classes derived from the kube QoS of its cgroup: no pod of
    the cluster has that key, so noderesource counts it as a dangling metric (its usage, when its class is not
    batch/free) until a later batch names it, which renames its slot, samples already held included.

    `uid` is the window's own copy of ref.uid and namespaces are interned: 10,000 nodes × 100 pods of strings
    are the largest Python-object cost of the service.
    """
    name = ref.name or uid
    namespace = sys.intern(ref.namespace) if ref.name else ""
    return PodInfo(
        namespace=namespace,
        name=name,
        uid=uid,
        priority=vocab.priority_class_with_default(ref.labels, ref.priority, ref.kube_qos),
        qos=vocab.qos_class_with_default(ref.labels, ref.kube_qos),
        cpu_request=ref.cpu_request,
        memory_request=ref.memory_request,
        created_at=ref.created_at,
        terminating=ref.terminating,
    )


def _append_samples(table: Table, samples: Sequence[tuple[float, ...]], names: Sequence[str]) -> None:
    if samples:
        rows = sample_rows(samples, len(names))
        table.append({name: rows[:, i] for i, name in enumerate(names)}, rows.shape[0])


def _runs(index: npt.NDArray[Any]) -> tuple[npt.NDArray[np.intp], npt.NDArray[np.float32]]:
    """Where each run of equal values in a grouped index starts, and how long it is (numpy.diff's generality
    costs more than the rest of the arithmetic here)."""
    starts = np.empty(1 + int(np.count_nonzero(index[1:] != index[:-1])), np.intp)
    starts[0] = 0
    starts[1:] = (index[1:] != index[:-1]).nonzero()[0] + 1
    ends = np.empty_like(starts)
    ends[:-1] = starts[1:]
    ends[-1] = index.size
    return starts, (ends - starts).astype(F4)


def pod_chunk_seconds(spec: node.MetricCollectPolicy) -> int:
    """Length of the report-grid chunks pod buckets merge in: every pod window is a union of whole chunks."""
    eff = effective_policy(spec)
    return math.gcd(eff.report_interval_seconds, eff.aggregate_duration_seconds)


class NodeWindow:
    """One node's recent samples, fed batch by batch (`add`) and bounded by the spec's longest window.

    `phase` is the node's report phase (core.report_phase): report times are phase + k × interval, and pod
    buckets merge in chunks of that grid.
    """

    def __init__(self, spec: node.MetricCollectPolicy, *, phase: int = 0, last_report: float | None = None) -> None:
        self._horizon, self._pod_horizon = retention_seconds(spec)
        self._memory_policy = spec.node_memory_collect_policy
        self._phase = float(phase)
        self._chunk = float(pod_chunk_seconds(spec))
        rows = int(self._horizon) + _SERIES_SLACK_ROWS
        self._series = Table(_SERIES_COLUMNS, rows)
        self._series_gaps = False  # whether any row lacks a node or a system sample (NaN)
        self._node_memory = Table(_MEMORY_COLUMNS, rows)  # the policy's variant; unused without page cache
        self._pods = ChunkBuckets(_POD_TABLE_INITIAL_ROWS)
        self._host_apps: HostApps | None = None  # made by the first batch with host applications
        self._psi: PsiBuckets | None = None  # made by the first batch with PSI
        self._numa = Table(_NUMA_COLUMNS, _NUMA_TABLE_INITIAL_ROWS)  # one row per batch and NUMA node
        self._aggregate_seconds = float(effective_policy(spec).aggregate_duration_seconds)
        self._slot_of: dict[str, int] = {}
        self._infos: list[PodInfo | None] = []
        self._info_seen: list[float] = []
        self._free_slots: list[int] = []
        self._pod_lists: dict[int, npt.NDArray[np.int64]] = {}  # digest -> slot of each listed pod
        self._newest_list: npt.NDArray[np.int64] = np.empty(0, _I8)  # the newest batch's pod list, as slots
        self._added_list: npt.NDArray[np.int64] | None = None  # the pod list of the batch added last, as slots
        self._held = _HeldBatches()
        self._newest_end: float | None = None
        self._next_compaction = -math.inf
        self._first_start: float | None = None
        self._last_report = last_report
        self.unattributed_batches = 0
        """Batches whose pod rows were dropped because they named a pod list this window was never sent."""

    # -- read side

    @property
    def newest_end(self) -> float | None:
        return self._newest_end

    @property
    def last_report(self) -> float | None:
        return self._last_report

    @property
    def first_start(self) -> float | None:
        """The earliest window_start ever added: no report round before it has any data."""
        return self._first_start

    @property
    def pods(self) -> dict[str, PodInfo]:
        """What is known of every pod that still has samples in the window (newest pod list wins), by uid."""
        return {uid: info for uid, slot in self._slot_of.items() if (info := self._infos[slot]) is not None}

    def capacities(self) -> dict[str, int]:
        """Allocated rows per table (what bounds memory); for tests and the service's gauges."""
        tables = {"series": self._series, "node_memory": self._node_memory, "pods": self._pods.table}
        apps = {} if self._host_apps is None else self._host_apps.capacities()
        psi_tables = {} if self._psi is None else self._psi.capacities()
        counts = {name: table.capacity for name, table in tables.items()} | {"pod_slots": len(self._infos)}
        return counts | apps | psi_tables

    # -- write side

    def mark_reported(self, report_time: float) -> None:
        self._last_report = report_time if self._last_report is None else max(self._last_report, report_time)

    def rewind_report(self, last_report: float | None) -> None:
        """Go back to an earlier last report: reports computed but never published come due again."""
        self._last_report = last_report

    def add(self, batch: node.NodeMetricsReported) -> bool:
        """Take one batch; False when it was already held or is entirely older than every window kept."""
        if batch.window_start in self._held:
            return False
        newest = batch.window_end if self._newest_end is None else max(self._newest_end, batch.window_end)
        if batch.window_end <= newest - self._horizon:
            return False
        self._newest_end = newest
        self._first_start = (
            batch.window_start if self._first_start is None else min(self._first_start, batch.window_start)
        )
        self._held.add(batch.window_start, batch.window_end)
        self._add_series(batch)
        if self._memory_policy == koordinator.MEMORY_WITH_PAGE_CACHE:
            _append_samples(self._node_memory, batch.memory_with_page_cache, ("t", "mem"))
        elif self._memory_policy == koordinator.MEMORY_WITH_HOT_PAGE_CACHE:
            _append_samples(self._node_memory, batch.memory_with_hot_page, ("t", "mem"))
        self._add_numa(batch)
        listed = self._added_list = self._listed_slots(batch)
        if batch.window_end == newest and listed is not None:
            self._newest_list = listed
        chunk = math.floor((batch.window_start - self._phase) / self._chunk)
        inside_one_chunk = batch.window_end <= self._phase + (chunk + 1) * self._chunk
        self._add_pod_buckets(batch, listed, chunk=chunk, inside_one_chunk=inside_one_chunk)
        if batch.host_applications:
            if self._host_apps is None:
                self._host_apps = HostApps(self._memory_policy)
            self._host_apps.add(batch, chunk=chunk, inside_one_chunk=inside_one_chunk)
        if batch.node_psi or len(batch.pod_psi):
            if self._psi is None:
                self._psi = PsiBuckets()
            self._psi.add(batch, listed, chunk=chunk, inside_one_chunk=inside_one_chunk, slots=len(self._infos))
        self._expire(newest)
        return True

    def _add_numa(self, batch: node.NodeMetricsReported) -> None:
        """Each NUMA node's samples of the batch as one row of sums (the status averages them over whole batches
        inside the aggregate window, as pod buckets are)."""
        if not batch.numa_samples:
            return
        rows = np.asarray(batch.numa_samples, dtype=_F8)
        ids, index = np.unique(rows[:, 1].astype(_I8), return_inverse=True)
        count = np.bincount(index, minlength=ids.size).astype(_F8)
        sums = {
            name: np.bincount(index, weights=rows[:, column], minlength=ids.size)
            for name, column in (("cpu", 2), ("mem", 3), ("sys_cpu", 4), ("sys_mem", 5))
        }
        t_min = np.full(ids.size, np.inf)
        t_max = np.full(ids.size, -np.inf)
        np.minimum.at(t_min, index, rows[:, 0])
        np.maximum.at(t_max, index, rows[:, 0])
        self._numa.append({"t_min": t_min, "t_max": t_max, "numa": ids, "count": count, **sums}, ids.size)

    def numa_usages(self, report_time: float) -> list[node.NumaUsage]:
        """Each NUMA node's average usage and system usage over the aggregate window before `report_time`, by id;
        a NUMA node without samples there is left out (spec §1.6 item 4)."""
        if not self._numa.size:
            return []
        inside = (self._numa.col("t_min") >= report_time - self._aggregate_seconds) & (
            self._numa.col("t_max") < report_time
        )
        ids = self._numa.col("numa")[inside]
        usages = []
        for numa_id in np.unique(ids).tolist():
            rows = inside.nonzero()[0][ids == numa_id]
            count = float(self._numa.col("count")[rows].sum())

            def avg(name: str, rows: npt.NDArray[np.intp] = rows, count: float = count) -> float:
                return float(self._numa.col(name)[rows].sum()) / count

            usages.append(
                node.NumaUsage(
                    numa_node_id=int(numa_id),
                    node_usage=node.ResourceMap(resources={CPU: int(avg("cpu") * 1000), MEMORY: int(avg("mem"))}),
                    system_usage=node.ResourceMap(
                        resources={CPU: int(avg("sys_cpu") * 1000), MEMORY: int(avg("sys_mem"))}
                    ),
                )
            )
        return usages

    def psi_metric(self, report_time: float) -> psi.PsiMetric | None:
        """The node's and its pods' average PSI stall ratios over the aggregate window before `report_time`; None
        when the node sent no PSI there."""
        if self._psi is None:
            return None
        span = Span(report_time - self._aggregate_seconds, report_time, closed=False)
        return self._psi.metric(span, self._infos)

    def added_pods(self) -> list[PodInfo | None] | None:
        """What is known of each pod of the pod list of the batch `add` took last, in the list's order (None for
        a pod no longer held); None when that batch named a list this window lacks."""
        return None if self._added_list is None else [self._infos[slot] for slot in self._added_list.tolist()]

    def current_pods(self) -> list[PodInfo]:
        """The pods of the newest batch's list: the pods on the node now (the prod predictor's pods)."""
        return [info for slot in self._newest_list.tolist() if (info := self._infos[slot]) is not None]

    def _add_series(self, batch: node.NodeMetricsReported) -> None:
        nodes, system = batch.node_samples, batch.system_samples
        if not nodes and not system:
            return
        if len(nodes) == len(system) and all(a[0] == b[0] for a, b in zip(nodes, system, strict=True)):
            n, s = sample_rows(nodes, 3), sample_rows(system, 3)
            self._series.append(
                {"t": n[:, 0], "cpu": n[:, 1], "mem": n[:, 2], "sys_cpu": s[:, 1], "sys_mem": s[:, 2]}, len(n)
            )
            return
        self._series_gaps = True
        if nodes:
            n = sample_rows(nodes, 3)
            self._series.append(
                {"t": n[:, 0], "cpu": n[:, 1], "mem": n[:, 2], "sys_cpu": np.nan, "sys_mem": np.nan}, len(n)
            )
        if system:
            s = sample_rows(system, 3)
            self._series.append(
                {"t": s[:, 0], "cpu": np.nan, "mem": np.nan, "sys_cpu": s[:, 1], "sys_mem": s[:, 2]}, len(s)
            )

    def _add_pod_buckets(
        self,
        batch: node.NodeMetricsReported,
        listed: npt.NDArray[np.int64] | None,
        *,
        chunk: float,
        inside_one_chunk: bool,
    ) -> None:
        """One bucket per pod that has rows (`listed`: the slots of the batch's pod list), merged into the pod's bucket
        of the open chunk where there is one."""
        rows = batch.pod_samples.arrays()
        if not len(rows):
            return
        if listed is None or listed.size <= int(rows.index[-1]):
            self.unattributed_batches += 1
            return
        starts, counts = _runs(rows.index)
        if self._memory_policy == koordinator.MEMORY_WITH_PAGE_CACHE:
            if rows.memory_with_page_cache.size:
                mem_count, mem_sum = counts, np.add.reduceat(rows.memory_with_page_cache, starts).astype(_F8)
            else:  # no page-cache series: these buckets never count toward pod memory
                mem_count, mem_sum = np.zeros_like(counts), np.zeros(starts.size, _F8)
        else:
            mem_count, mem_sum = counts, np.add.reduceat(rows.memory, starts).astype(_F8)
        buckets: dict[str, npt.NDArray[Any]] = {
            "slot": listed[rows.index[starts]],
            "count": counts,
            "cpu_sum": np.add.reduceat(rows.cpu, starts),
            "mem_count": mem_count,
            "mem_sum": mem_sum,
            "t_min": np.minimum.reduceat(rows.t, starts),
            "t_max": np.maximum.reduceat(rows.t, starts),
        }
        self._pods.add(buckets, chunk=chunk, inside_one_chunk=inside_one_chunk, slots=len(self._infos))

    def _listed_slots(self, batch: node.NodeMetricsReported) -> npt.NDArray[np.int64] | None:
        """The slot of each pod in the batch's pod list, or None when it names a list this window lacks."""
        if not batch.pods_digest and not batch.pods:
            return _NO_PODS  # the list is sent, and empty: no pod runs on the node
        known = self._pod_lists.get(batch.pods_digest) if batch.pods_digest else None
        if known is not None or not batch.pods:
            return known
        seen_at = batch.window_end
        slots = np.fromiter((self._slot_for(ref, seen_at) for ref in batch.pods), _I8, len(batch.pods))
        if batch.pods_digest:
            if len(self._pod_lists) >= _POD_LISTS_REMEMBERED:
                del self._pod_lists[next(iter(self._pod_lists))]
            self._pod_lists[batch.pods_digest] = slots
        return slots

    def _slot_for(self, ref: node.PodRef, seen_at: float) -> int:
        """The pod's slot, allocating one for a new uid; what the newest batch says of a pod wins."""
        slot = self._slot_of.get(ref.uid)
        if slot is None:
            slot = self._free_slots.pop() if self._free_slots else len(self._infos)
            if slot == len(self._infos):
                self._infos.append(None)
                self._info_seen.append(-math.inf)
            self._slot_of[ref.uid] = slot
            self._infos[slot] = _pod_info(ref, ref.uid)
        elif seen_at >= self._info_seen[slot]:
            current = self._infos[slot]
            info = _pod_info(ref, current.uid if current is not None else ref.uid)
            if info != current:  # an unchanged pod keeps its objects: fewer allocations, no duplicate strings
                self._infos[slot] = info
        self._info_seen[slot] = max(self._info_seen[slot], seen_at)
        return slot

    def _listed_infos(self) -> list[PodInfo | None]:
        """The pods podsMetric reports, by slot: those of the newest batch's list; None for every other slot."""
        infos: list[PodInfo | None] = [None] * len(self._infos)
        for slot in self._newest_list.tolist():
            infos[slot] = self._infos[slot]
        return infos

    def _expire(self, newest: float) -> None:
        # Every query masks rows by its own window, so rows past the horizon are dead weight, not wrong answers:
        # squeezing them out once per compaction period instead of per batch costs a sixth as much.
        if newest < self._next_compaction:
            return
        self._next_compaction = newest + _COMPACTION_PERIOD_SECONDS
        cutoff = newest - self._horizon
        for table in (self._series, self._node_memory):
            table.expire("t", cutoff)
        self._held.expire(cutoff)
        self._numa.expire("t_max", newest - self._pod_horizon)
        if self._pods.expire(newest - self._pod_horizon):
            self._forget_pods_without_buckets()
        if self._host_apps is not None and self._host_apps.expire(newest - self._pod_horizon):
            self._host_apps = None  # none left: a node without host applications keeps nothing for them
        if self._psi is not None and self._psi.expire(newest - self._pod_horizon):
            self._psi = None

    def _forget_pods_without_buckets(self) -> None:
        """Free the slots of pods with no bucket left, except those a remembered pod list still refers to."""
        used = self._pods.used(len(self._infos))
        if self._psi is not None:
            used |= self._psi.used(len(self._infos))
        for slots in self._pod_lists.values():
            used[slots] = True
        for slot in np.flatnonzero(~used).tolist():
            info = self._infos[slot]
            if info is None:
                continue
            del self._slot_of[info.uid]
            self._infos[slot] = None
            self._info_seen[slot] = -math.inf
            self._free_slots.append(slot)

    def _series_of(self, column: str, t: npt.NDArray[np.float64]) -> Series:
        """One column with its times (`t`, the table's time column: one array object for every series, so the
        status assembly locates its windows once), leaving out rows where the column has no sample."""
        values = self._series.col(column)
        if not self._series_gaps:
            return Series(t, values)
        present = ~np.isnan(values)
        return Series(t[present], values[present])

    def _sources(self) -> Sources:
        t = self._series.col("t")
        node_memory = self._series_of("mem", t)
        if self._memory_policy == koordinator.MEMORY_WITH_PAGE_CACHE or self._node_memory.size:
            # koordlet falls back to the plain series unless the cold-page collector runs; ours ran iff it reported.
            node_memory = Series(self._node_memory.col("t"), self._node_memory.col("mem"))
        pods = self._pods.table
        buckets = PodBuckets(
            pod=pods.col("slot").astype(_I8),
            count=pods.col("count").astype(_F8),
            cpu_sum=pods.col("cpu_sum"),
            mem_count=pods.col("mem_count").astype(_F8),
            mem_sum=pods.col("mem_sum"),
            t_min=pods.col("t_min"),
            t_max=pods.col("t_max"),
            infos=self._listed_infos(),
        )
        host_apps: HostAppBuckets | None = None if self._host_apps is None else self._host_apps.buckets()
        return Sources(
            node_cpu=self._series_of("cpu", t),
            node_memory=node_memory,
            system_cpu=self._series_of("sys_cpu", t),
            system_memory=self._series_of("sys_mem", t),
            pods=buckets,
            closed_end=False,
            host_apps=host_apps,
        )


def _checked(window: NodeWindow, spec: node.MetricCollectPolicy) -> Sources:
    if spec.node_memory_collect_policy != window._memory_policy:
        raise ValueError(
            f"this window keeps {window._memory_policy} node memory, not {spec.node_memory_collect_policy}"
        )
    return window._sources()


def compute_status(window: NodeWindow, *, report_time: float, spec: node.MetricCollectPolicy) -> node.NodeMetricStatus:
    """The NodeMetric status of one report round at `report_time` (§1.6 items 1–6, 8)."""
    status = assemble_status(_checked(window, spec), report_time=report_time, spec=spec)
    numa_usages = window.numa_usages(report_time)
    if not numa_usages:
        return status
    return msgspec.structs.replace(
        status, node_metric=msgspec.structs.replace(status.node_metric, numa_usages=numa_usages)
    )


def count_samples(window: NodeWindow, *, report_time: float, spec: node.MetricCollectPolicy) -> list[WindowCount]:
    """Sample counts per window of the report at `report_time`."""
    return count_windows(_checked(window, spec), report_time=report_time, spec=spec)


def due_report(window: NodeWindow, *, spec: node.MetricCollectPolicy, phase: int = 0) -> float | None:
    """The newest report time (a multiple of the effective interval, plus `phase` seconds — see
    core.report_phase) the window has reached and not reported.

    Driven by event time, so a replay computes the same rounds; older missed rounds are skipped, not caught up,
    and no round is due at or before the first batch (its window would hold nothing).
    """
    if window.newest_end is None or window.first_start is None:
        return None
    interval = effective_policy(spec).report_interval_seconds
    due = float(math.floor((window.newest_end - phase) / interval) * interval + phase)
    if due <= window.first_start or (window.last_report is not None and due <= window.last_report):
        return None
    return due
