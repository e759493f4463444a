"""A node's streaming window: bounded numpy state fed with agent batches, and the reports it yields.

Callers: services/nodemetric/service.py feeds each node's NodeMetricsReported batches into a `NodeWindow`,
asks `due_report` when a report round is due and publishes `compute_status`.

The report at T covers [T − w, T): the sample at exactly T belongs to the batch [T, T + interval), and a report
must not depend on whether that batch had arrived when it was computed, or replays would differ.

Memory model. Node, system and node-memory-variant samples are kept raw in numpy columns bounded by the
longest window plus one report interval, so percentiles are exact. Pod samples are kept only as one bucket
per pod per batch (count, sums, first and last sample time) for the aggregate window. That is exact when
report times fall on batch boundaries — the agent cuts batches on multiples of its publish interval, which
divides the report interval — and otherwise it leaves out the batch straddling each window edge. Pod memory
under usageWithHotPageCache uses the without-page-cache samples: the agent reports no per-pod hot-page series.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import koordinator, node, vocab
from services.nodemetric.core import (
    PodBuckets,
    PodInfo,
    Series,
    Sources,
    WindowCount,
    assemble_status,
    count_windows,
    effective_policy,
    retention_seconds,
    sample_rows,
)

_COMPACTION_PERIOD_SECONDS = 60.0  # expired rows linger at most this long (plus one batch)
_SERIES_SLACK_ROWS = 128  # room for a compaction period and one batch on top of a full window at 1 sample/s
_POD_TABLE_INITIAL_ROWS = 64
_FIRST_ROW = np.zeros(1, dtype=np.int64)
_F8, _I8 = np.dtype(np.float64), np.dtype(np.int64)
_SAMPLE_COLUMNS = {"t": _F8, "cpu": _F8, "mem": _F8}
_MEMORY_COLUMNS = {"t": _F8, "mem": _F8}
_POD_COLUMNS = {
    "pod": _I8,
    "count": _F8,
    "cpu_sum": _F8,
    "mem_sum": _F8,
    "pc_count": _F8,
    "pc_sum": _F8,
    "t_min": _F8,
    "t_max": _F8,
}


class _Table:
    """Numpy columns whose rows [0, size) are live; expired rows are squeezed out in place.

    Arrays are allocated on first use and grow (doubling) only when live rows outgrow them, so a node under
    steady load allocates nothing per batch.
    """

    def __init__(self, dtypes: Mapping[str, np.dtype[np.generic]], initial_rows: int) -> None:
        self._dtypes = dict(dtypes)
        self._initial_rows = initial_rows
        self._cols: dict[str, npt.NDArray[np.generic]] = {name: np.empty(0, dtype) for name, dtype in dtypes.items()}
        self.size = 0

    @property
    def capacity(self) -> int:
        return len(next(iter(self._cols.values())))

    def col(self, name: str) -> npt.NDArray[Any]:
        return self._cols[name][: self.size]

    def append(self, columns: Mapping[str, npt.ArrayLike], rows: int) -> None:
        needed = self.size + rows
        if needed > self.capacity:
            self._resize(max(needed, 2 * self.capacity, self._initial_rows))
        for name, col in self._cols.items():
            col[self.size : needed] = columns[name]
        self.size = needed

    def expire(self, time_column: str, cutoff: float) -> bool:
        """Drop rows whose `time_column` is before `cutoff`; True when any went."""
        t = self.col(time_column)
        if self.size == 0 or float(t.min()) >= cutoff:
            return False
        keep = t >= cutoff
        kept = int(keep.sum())
        for col in self._cols.values():
            col[:kept] = col[: self.size][keep]
        self.size = kept
        return True

    def _resize(self, rows: int) -> None:
        for name, col in self._cols.items():
            grown = np.empty(rows, self._dtypes[name])
            grown[: self.size] = col[: self.size]
            self._cols[name] = grown


def _pod_info(ref: node.PodRef) -> PodInfo:
    """A pod the agent knows only by uid is reported as namespace "" and name = uid."""
    name = ref.name or ref.uid
    namespace = ref.namespace if ref.name else ""
    return PodInfo(
        namespace=namespace,
        name=name,
        uid=ref.uid,
        priority=vocab.priority_class_with_default(ref.labels, ref.priority, ref.kube_qos),
        qos=vocab.qos_class_with_default(ref.labels, ref.kube_qos),
    )


def _append_samples(table: _Table, samples: Sequence[tuple[float, ...]], names: Sequence[str]) -> None:
    if samples:
        rows = sample_rows(samples, len(names))
        table.append({name: rows[:, i] for i, name in enumerate(names)}, rows.shape[0])


class NodeWindow:
    """One node's recent samples, fed batch by batch (`add`) and bounded by the spec's longest window."""

    def __init__(self, spec: node.MetricCollectPolicy, *, last_report: float | None = None) -> None:
        self._horizon, self._pod_horizon = retention_seconds(spec)
        rows = int(self._horizon) + _SERIES_SLACK_ROWS
        self._node = _Table(_SAMPLE_COLUMNS, rows)
        self._system = _Table(_SAMPLE_COLUMNS, rows)
        self._page_cache = _Table(_MEMORY_COLUMNS, rows)
        self._hot_page = _Table(_MEMORY_COLUMNS, rows)
        self._pods = _Table(_POD_COLUMNS, _POD_TABLE_INITIAL_ROWS)
        self._slot_of: dict[str, int] = {}
        self._refs: list[node.PodRef | None] = []
        self._ref_seen: list[float] = []
        self._infos: list[PodInfo | None] = []
        self._free_slots: list[int] = []
        self._held: dict[float, float] = {}  # window_start -> window_end of batches already added
        self._newest_end: float | None = None
        self._next_compaction = -math.inf
        self._first_start: float | None = None
        self._last_report = last_report

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
    def pods(self) -> dict[str, node.PodRef]:
        """The latest PodRef of every pod that still has samples in the window, by uid."""
        return {uid: ref for uid, slot in self._slot_of.items() if (ref := self._refs[slot]) is not None}

    def capacities(self) -> dict[str, int]:
        """Allocated rows per table (what bounds memory); for tests and the service's gauges."""
        tables = {
            "node": self._node,
            "system": self._system,
            "page_cache": self._page_cache,
            "hot_page": self._hot_page,
            "pods": self._pods,
        }
        return {name: table.capacity for name, table in tables.items()} | {"pod_slots": len(self._infos)}

    # -- write side

    def set_spec(self, spec: node.MetricCollectPolicy) -> None:
        """Adopt a new collect policy; a longer window only fills with data that arrives from now on."""
        self._horizon, self._pod_horizon = retention_seconds(spec)

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
        self._held[batch.window_start] = batch.window_end
        _append_samples(self._node, batch.node_samples, ("t", "cpu", "mem"))
        _append_samples(self._system, batch.system_samples, ("t", "cpu", "mem"))
        _append_samples(self._page_cache, batch.memory_with_page_cache, ("t", "mem"))
        _append_samples(self._hot_page, batch.memory_with_hot_page, ("t", "mem"))
        self._add_pod_buckets(batch)
        self._expire(newest)
        return True

    def _add_pod_buckets(self, batch: node.NodeMetricsReported) -> None:
        """One bucket per pod that has rows; the schema guarantees rows are grouped by pod."""
        columns = batch.pod_samples
        if not columns.pod:
            return
        pod_index = np.asarray(columns.pod, dtype=np.int64)
        starts = np.flatnonzero(np.diff(pod_index)) + 1
        starts = np.concatenate((_FIRST_ROW, starts))
        counts = np.diff(starts, append=pod_index.size)
        t = np.asarray(columns.t, dtype=np.float64)
        seen_at = batch.window_end
        slots = [self._slot_for(batch.pods[i], seen_at) for i in pod_index[starts].tolist()]
        if columns.memory_with_page_cache:
            pc_count: npt.ArrayLike = counts
            pc_sum: npt.ArrayLike = np.add.reduceat(np.asarray(columns.memory_with_page_cache, np.float64), starts)
        else:
            pc_count = pc_sum = 0.0  # no page-cache series: these buckets never count toward that policy
        bucket_columns: dict[str, npt.ArrayLike] = {
            "pod": slots,
            "count": counts,
            "cpu_sum": np.add.reduceat(np.asarray(columns.cpu, dtype=np.float64), starts),
            "mem_sum": np.add.reduceat(np.asarray(columns.memory, dtype=np.float64), starts),
            "pc_count": pc_count,
            "pc_sum": pc_sum,
            "t_min": np.minimum.reduceat(t, starts),
            "t_max": np.maximum.reduceat(t, starts),
        }
        self._pods.append(bucket_columns, starts.size)

    def _slot_for(self, ref: node.PodRef, seen_at: float) -> int:
        """The pod's row index, allocating one for a new uid; the newest batch's PodRef wins."""
        slot = self._slot_of.get(ref.uid)
        if slot is None:
            slot = self._free_slots.pop() if self._free_slots else len(self._infos)
            if slot == len(self._infos):
                self._refs.append(None)
                self._ref_seen.append(-math.inf)
                self._infos.append(None)
            self._slot_of[ref.uid] = slot
        if seen_at >= self._ref_seen[slot]:
            self._ref_seen[slot] = seen_at
            if self._refs[slot] != ref:
                self._refs[slot] = ref
                self._infos[slot] = _pod_info(ref)
        return slot

    def _expire(self, newest: float) -> None:
        cutoff = newest - self._horizon
        # Every query masks rows by its own window, so rows past the horizon are dead weight, not wrong answers:
        # squeezing them out once per compaction period instead of per batch costs a sixth as much.
        if newest >= self._next_compaction:
            self._next_compaction = newest + _COMPACTION_PERIOD_SECONDS
            for table in (self._node, self._system, self._page_cache, self._hot_page):
                table.expire("t", cutoff)
            if self._pods.expire("t_min", newest - self._pod_horizon):
                self._forget_pods_without_buckets()
        # Batches arrive in time order almost always, so the oldest are at the front of the dict.
        while self._held and next(iter(self._held.values())) <= cutoff:
            del self._held[next(iter(self._held))]

    def _forget_pods_without_buckets(self) -> None:
        used = np.zeros(len(self._infos), dtype=bool)
        used[self._pods.col("pod")] = True
        for slot in np.flatnonzero(~used).tolist():
            ref = self._refs[slot]
            if ref is None:
                continue
            del self._slot_of[ref.uid]
            self._refs[slot] = self._infos[slot] = None
            self._ref_seen[slot] = -math.inf
            self._free_slots.append(slot)

    def _sources(self, memory_policy: str) -> Sources:
        node_t = self._node.col("t")
        node_memory = Series(node_t, self._node.col("mem"))
        pods_memory = (self._pods.col("count"), self._pods.col("mem_sum"))
        if memory_policy == koordinator.MEMORY_WITH_PAGE_CACHE:
            node_memory = Series(self._page_cache.col("t"), self._page_cache.col("mem"))
            pods_memory = (self._pods.col("pc_count"), self._pods.col("pc_sum"))
        elif memory_policy == koordinator.MEMORY_WITH_HOT_PAGE_CACHE and self._hot_page.size:
            # koordlet falls back to the plain series unless the cold-page collector runs; ours ran iff it reported.
            node_memory = Series(self._hot_page.col("t"), self._hot_page.col("mem"))
        buckets = PodBuckets(
            pod=self._pods.col("pod"),
            count=self._pods.col("count"),
            cpu_sum=self._pods.col("cpu_sum"),
            mem_count=pods_memory[0],
            mem_sum=pods_memory[1],
            t_min=self._pods.col("t_min"),
            t_max=self._pods.col("t_max"),
            infos=self._infos,
        )
        return Sources(
            node_cpu=Series(node_t, self._node.col("cpu")),
            node_memory=node_memory,
            system_cpu=Series(self._system.col("t"), self._system.col("cpu")),
            system_memory=Series(self._system.col("t"), self._system.col("mem")),
            pods=buckets,
            closed_end=False,
        )


def compute_status(window: NodeWindow, *, report_time: float, spec: node.MetricCollectPolicy) -> node.NodeMetricStatus:
    """The NodeMetric status of one report round at `report_time` (§1.6 items 1, 2, 3, 5, 8)."""
    return assemble_status(window._sources(spec.node_memory_collect_policy), report_time=report_time, spec=spec)


def count_samples(window: NodeWindow, *, report_time: float, spec: node.MetricCollectPolicy) -> list[WindowCount]:
    """Sample counts per window of the report at `report_time`."""
    return count_windows(window._sources(spec.node_memory_collect_policy), report_time=report_time, spec=spec)


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
