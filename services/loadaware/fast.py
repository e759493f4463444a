"""The filter and score of services.loadaware.core for thousands of candidate nodes at once, with numpy. Pure.

kube-scheduler asks about every feasible node (5,000 in the benchmark) for each pod, twice; core's per-node functions
cost microseconds each, too much for a 20 ms budget. `Matrix` keeps, per node, the rows core would compute before adding
the incoming pod — allocatable, and the estimated usage without the pod for each profile (plain or aggregated usage for
the filter and the score, prod usage) — refreshed lazily for the nodes LoadState marks dirty, using core.estimate
itself. A request then adds the pod's estimate and compares whole columns. Nodes whose annotation overrides the
thresholds take core.filter_node (their profile differs); the caps node QoS eviction puts on a pod's thresholds are
computed once per resource-threshold strategy and picked per row by the node's strategy index. The score depends on
neither. tests/unit/test_loadaware_fast.py checks that both paths agree on random states. Used by
services.loadaware.extender.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

import numpy as np
import numpy.typing as npt

from services.common import watermarks
from services.loadaware import core
from services.loadaware.state import LoadState

Int = npt.NDArray[np.int64]
MAX_AMOUNT: Final = (2**63 - 1) // 400
"""Rows hold amounts saturated at ±this (2.3e16: 23 billion cores in millicores, 20 PiB of memory), so the sums and
the ×200 of the percentages below cannot overflow int64, which numpy would wrap silently. A quantity may reach 2^63-1
whole units (schemas.quantity), 1000 times that in millicores; a pod asking that much fits no real node either way."""
_EMPTY: Final[core.IncomingPod] = core.IncomingPod(key="", estimated={}, prod=False, daemonset=False)


class Matrix:
    def __init__(self, state: LoadState) -> None:
        self.state = state
        self.vector = state.vector
        width = len(self.vector)
        self.index: dict[str, int] = {}
        self.names: list[str] = []
        self.alloc: Int = np.zeros((0, width), np.int64)
        self.filter_base: Int = np.zeros((0, width), np.int64)
        self.score_base: Int = np.zeros((0, width), np.int64)
        self.prod_base: Int = np.zeros((0, width), np.int64)
        self.update_time = np.zeros(0, np.float64)
        self.has_metric = np.zeros(0, bool)
        self.has_status = np.zeros(0, bool)
        self.known = np.zeros(0, bool)
        self.special = np.zeros(0, bool)
        self.qos_strategy = np.zeros(0, np.int64)
        args = state.args
        self.filter_profile = core.filter_profile(args, None, prod=False, vector=self.vector)
        self.prod_profile = core.filter_profile(args, None, prod=True, vector=self.vector)
        self.score_aggregation = core.score_aggregation(args)
        self.weights = np.array([args.resource_weights.get(r, 0) for r in self.vector], np.int64)

    def _row(self, name: str) -> int:
        row = self.index.get(name)
        if row is not None:
            return row
        row = len(self.names)
        self.index[name] = row
        self.names.append(name)
        if row >= len(self.known):
            grow = max(64, len(self.known))
            for attr in ("alloc", "filter_base", "score_base", "prod_base"):
                old = getattr(self, attr)
                setattr(self, attr, np.concatenate([old, np.zeros((grow, old.shape[1]), np.int64)]))
            self.update_time = np.concatenate([self.update_time, np.zeros(grow, np.float64)])
            self.qos_strategy = np.concatenate([self.qos_strategy, np.zeros(grow, np.int64)])
            for attr in ("has_metric", "has_status", "known", "special"):
                setattr(self, attr, np.concatenate([getattr(self, attr), np.zeros(grow, bool)]))
        return row

    def refresh(self) -> None:
        state = self.state
        while state.dirty:
            name = state.dirty.pop()
            row = self._row(name)
            entry = state.nodes.get(name)
            self.known[row] = entry is not None
            self.alloc[row] = self._vec((entry.allocatable if entry else None) or {})
            self.special[row] = entry is not None and entry.overrides is not None
            self.qos_strategy[row] = entry.qos_strategy if entry else 0
            load = state.load_of(name)
            metric = entry.metric if entry else None
            self.has_metric[row] = metric is not None and load is not None
            self.has_status[row] = metric is not None and metric.has_node_metric
            if metric is None or load is None:
                continue
            self.update_time[row] = -np.inf if metric.update_time is None else metric.update_time
            profile = self.filter_profile
            self.filter_base[row] = self._vec(
                core.estimate(metric, load, _EMPTY, prod=False, aggregation=profile.aggregation).total
            )
            self.score_base[row] = self._vec(
                core.estimate(metric, load, _EMPTY, prod=False, aggregation=self.score_aggregation).total
            )
            self.prod_base[row] = self._vec(core.estimate(metric, load, _EMPTY, prod=True, aggregation=None).total)

    def _vec(self, amounts: dict[str, int]) -> Int:
        return np.array([max(-MAX_AMOUNT, min(amounts.get(r, 0), MAX_AMOUNT)) for r in self.vector], np.int64)

    def rows(self, names: Sequence[str]) -> Int:
        self.refresh()
        index = self.index
        return np.fromiter((index.get(n, -1) for n in names), np.int64, count=len(names))

    def filter(self, pod: core.IncomingPod, names: Sequence[str], *, now: float) -> tuple[list[str], dict[str, str]]:
        """(passed names, failed name → reason), as core.filter_node would answer for each name."""
        rows = self.rows(names)
        if pod.daemonset:
            return list(names), {}
        args = self.state.args
        found = rows >= 0
        safe = np.where(found, rows, 0)
        known = found & self.known[safe]
        special = known & self.special[safe]
        failed: dict[str, str] = {}
        profile = self.prod_profile if pod.prod and self.prod_profile.prod else self.filter_profile
        thresholds = np.array([profile.thresholds.get(r, 0) for r in self.vector], np.int64)
        caps = self._caps(pod)
        if thresholds.any() or caps is not None:
            check = known & ~special & self.has_metric[safe]
            limits = np.broadcast_to(thresholds, (len(names), len(self.vector)))
            if caps is not None:
                row_caps = caps[self.qos_strategy[safe]]
                limits = np.where(row_caps > 0, np.where(limits > 0, np.minimum(limits, row_caps), row_caps), limits)
                check &= limits.any(axis=1)  # a node whose limits are all zero passes unchecked, stale or not
            if args.filter_expired_node_metrics:
                stale = check & (now - self.update_time[safe] >= args.node_metric_expiration_seconds)
                if not args.enable_schedule_when_node_metrics_expired:
                    for i in np.flatnonzero(stale).tolist():
                        failed[names[i]] = core.REASON_EXPIRED
                check &= ~stale
            check &= self.has_status[safe]
            base = self.prod_base if profile.prod else self.filter_base
            idx = safe[check]
            alloc = self.alloc[idx]
            est = base[idx] + self._vec(pod.estimated)
            checked = (limits[check] > 0) & (alloc > 0)
            over = checked & (_go_percent(est, alloc) > limits[check])
            bad = over.any(axis=1)
            kind = "aggregated usage" if profile.aggregation is not None else "usage"
            positions = np.flatnonzero(check)[bad].tolist()
            first_over = over[bad].argmax(axis=1).tolist()
            reasons = [f"node(s) {resource} {kind} exceed threshold" for resource in self.vector]
            for position, which in zip(positions, first_over, strict=True):
                failed[names[position]] = reasons[which]
        for i in np.flatnonzero(special).tolist():
            verdict = core.filter_node(self.state, pod, names[i], now=now)
            if not verdict.passed:
                failed[names[i]] = verdict.reason
        return [n for n in names if n not in failed], failed

    def _caps(self, pod: core.IncomingPod) -> Int | None:
        """Per node QoS strategy, the pod's eviction caps by resource (0: none); None when no strategy caps it."""
        state = self.state
        if pod.eviction is None or not state.avoid_eviction_loops:
            return None
        per_strategy = [watermarks.eviction_caps(strategy, pod.eviction) for strategy in state.qos_strategies]
        if not any(per_strategy):
            return None
        return np.array([[caps.get(r, 0) for r in self.vector] for caps in per_strategy], np.int64)

    def scores(self, pod: core.IncomingPod, names: Sequence[str], *, now: float) -> list[int]:
        """core.score_node's 0..100 score of each name."""
        rows = self.rows(names)
        args = self.state.args
        out = np.zeros(len(names), np.int64)
        denominator = int(self.weights.sum()) + args.dominant_resource_weight
        if (not args.resource_weights and args.dominant_resource_weight == 0) or denominator <= 0:
            return [0] * len(names)
        found = rows >= 0
        safe = np.where(found, rows, 0)
        use = found & self.known[safe] & self.has_metric[safe] & self.has_status[safe]
        use &= now - self.update_time[safe] < args.node_metric_expiration_seconds
        idx = safe[use]
        base = self.prod_base if args.score_according_prod_usage and pod.prod else self.score_base
        alloc = self.alloc[idx]
        est = base[idx] + self._vec(pod.estimated)
        fits = (alloc > 0) & (est <= alloc)
        shares = np.where(fits, (alloc - est) * core.MAX_NODE_SCORE // np.where(alloc > 0, alloc, 1), 0)
        smallest = shares.min(axis=1) if shares.shape[1] else np.zeros(len(idx), np.int64)
        out[use] = (shares @ self.weights + args.dominant_resource_weight * smallest) // denominator
        return [int(v) for v in out.tolist()]


def _go_percent(est: Int, alloc: Int) -> Int:
    """core.percent of each cell: Go's math.Round(float64(est) / float64(alloc) * 100) (0 where alloc is 0)."""
    ratio = est.astype(np.float64) / np.where(alloc > 0, alloc, 1).astype(np.float64) * 100
    whole = np.trunc(ratio)
    rounded = whole + np.where(np.abs(ratio - whole) >= 0.5, np.copysign(1.0, ratio), 0.0)
    return rounded.astype(np.int64)
