"""A node's PSI stall ratios in its streaming window (issue 23, point 6): the node's and each pod's kept as bucket
sums per chunk of the report grid, as pod samples are, for the averages each report publishes beside the NodeMetric
status (NodeMetricComputed.psi; Koordinator's NodeMetric has no PSI field).

Called by services.nodemetric.window: a NodeWindow makes its `PsiBuckets` on the first batch carrying PSI and drops
it when the last bucket expires, so nodes whose kernel has no PSI spend nothing on it. A bucket holds, per signal
(schemas.psi.SIGNALS), how many ratios it sums and their sum, in float32 (ratios in [0, 1], at most a chunk of
samples: exact enough for an average, and half the bytes). Pods are the window's slots; the node is slot 0 of a
table of its own. Pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from schemas import node
from schemas.psi import SIGNALS, PodPsiMetric, PsiAverages, PsiMetric
from services.nodemetric.core import PodInfo, Span
from services.nodemetric.tables import F4, F8, ChunkBuckets

_COLUMNS: dict[str, np.dtype[Any]] = {
    "slot": np.dtype(np.int32),
    "t_min": F8,
    "t_max": F8,
    **{f"{signal}_{part}": F4 for signal in SIGNALS for part in ("n", "sum")},
}
_SUMS = tuple(f"{signal}_{part}" for signal in SIGNALS for part in ("n", "sum"))
_NODE_ROWS, _POD_ROWS = 8, 64


def _bucket_rows(
    starts: npt.NDArray[np.intp], t: npt.NDArray[np.float64], ratios: npt.NDArray[Any], slots: npt.NDArray[np.int64]
) -> dict[str, npt.NDArray[Any]]:
    """One bucket per run of rows (`starts`: where each begins; `slots`: its slot): the time bounds and, per signal,
    the count and sum of its ratios (`ratios`: rows × SIGNALS, NaN where absent)."""
    present = ~np.isnan(ratios)
    counts = np.add.reduceat(present, starts, axis=0)
    sums = np.add.reduceat(np.where(present, ratios, 0.0), starts, axis=0)
    buckets: dict[str, npt.NDArray[Any]] = {
        "slot": slots.astype(np.int32),
        "t_min": np.minimum.reduceat(t, starts),
        "t_max": np.maximum.reduceat(t, starts),
    }
    for i, signal in enumerate(SIGNALS):
        buckets[f"{signal}_n"] = counts[:, i].astype(F4)
        buckets[f"{signal}_sum"] = sums[:, i].astype(F4)
    return buckets


def _runs(index: npt.NDArray[Any]) -> npt.NDArray[np.intp]:
    """Where each run of equal values in a grouped, non-empty index starts."""
    starts = np.empty(1 + int(np.count_nonzero(index[1:] != index[:-1])), np.intp)
    starts[0] = 0
    starts[1:] = (index[1:] != index[:-1]).nonzero()[0] + 1
    return starts


def _averages(
    table_cols: dict[str, npt.NDArray[Any]], rows: npt.NDArray[np.bool_], slots: int
) -> list[PsiAverages | None]:
    """Per slot, the average of each signal over the buckets in `rows`; None for a slot with no ratio there."""
    idx = table_cols["slot"][rows]
    averages = np.full((slots, len(SIGNALS)), np.nan)
    for i, signal in enumerate(SIGNALS):
        n = np.bincount(idx, weights=table_cols[f"{signal}_n"][rows], minlength=slots)
        total = np.bincount(idx, weights=table_cols[f"{signal}_sum"][rows], minlength=slots)
        has = n > 0
        averages[has, i] = np.clip(total[has] / n[has], 0.0, 1.0)
    out: list[PsiAverages | None] = []
    # Python floats from one tolist(): NaN (no ratio) is the only value not equal to itself.
    for values in averages.tolist():
        ratios = {signal: v for signal, v in zip(SIGNALS, values, strict=True) if v == v}
        out.append(PsiAverages(**ratios) if ratios else None)
    return out


class PsiBuckets:
    def __init__(self) -> None:
        self._node = ChunkBuckets(_NODE_ROWS, columns=_COLUMNS, sums=_SUMS)
        self._pods = ChunkBuckets(_POD_ROWS, columns=_COLUMNS, sums=_SUMS)

    def add(
        self,
        batch: node.NodeMetricsReported,
        listed: npt.NDArray[np.int64] | None,
        *,
        chunk: float,
        inside_one_chunk: bool,
        slots: int,
    ) -> bool:
        """Take the batch's PSI (`listed`: the window's slot of each pod of its list; None when the window lacks that
        list); False when its pod PSI was dropped because the list is unknown or too short."""
        if batch.node_psi:
            samples = batch.node_psi
            node_t = np.fromiter((sample.t for sample in samples), F8, len(samples))
            values = np.array([sample.values() for sample in samples], dtype=F8).reshape(len(samples), len(SIGNALS))
            node_rows = _bucket_rows(np.zeros(1, np.intp), node_t, values, np.zeros(1, np.int64))
            self._node.add(node_rows, chunk=chunk, inside_one_chunk=inside_one_chunk, slots=1)
        if not len(batch.pod_psi):
            return True
        index, t, ratios = batch.pod_psi.arrays()
        if listed is None or listed.size <= int(index[-1]):
            return False
        starts = _runs(index)
        pod_rows = _bucket_rows(starts, t, ratios, listed[index[starts]])
        self._pods.add(pod_rows, chunk=chunk, inside_one_chunk=inside_one_chunk, slots=slots)
        return True

    def expire(self, cutoff: float) -> bool:
        """Drop buckets whose first ratio is before `cutoff`; True when none is left."""
        self._node.expire(cutoff)
        self._pods.expire(cutoff)
        return self._node.table.size == 0 and self._pods.table.size == 0

    def used(self, slots: int) -> npt.NDArray[np.bool_]:
        """Which of the window's `slots` pod slots have a PSI bucket (a slot must outlive them)."""
        return self._pods.used(slots)

    def metric(self, span: Span, infos: Sequence[PodInfo | None]) -> PsiMetric | None:
        """The node's and each pod's averages over `span` (pods by namespace and name); None when there is none."""
        node_table, pod_table = self._node.table, self._pods.table
        node_cols = {name: node_table.col(name) for name in _COLUMNS}
        node_avg = _averages(node_cols, span.mask(node_cols["t_min"], node_cols["t_max"]), 1)[0]
        pod_cols = {name: pod_table.col(name) for name in _COLUMNS}
        pod_avgs = _averages(pod_cols, span.mask(pod_cols["t_min"], pod_cols["t_max"]), len(infos))
        pods = [
            PodPsiMetric(namespace=info.namespace, name=info.name, uid=info.uid, averages=avg)
            for info, avg in zip(infos, pod_avgs, strict=True)
            if info is not None and avg is not None
        ]
        if node_avg is None and not pods:
            return None
        pods.sort(key=lambda p: (p.namespace, p.name))
        return PsiMetric(node=node_avg, pods=pods)

    def capacities(self) -> dict[str, int]:
        return {"psi_node": self._node.table.capacity, "psi_pods": self._pods.table.capacity}
