"""One Balance round of Koordinator's LowNodeLoad descheduler plugin (spec §11), as `koordbus calc low-node-load`
runs it. Pure: the clock is `now`, the detectors and the eviction limiter are the caller's objects.

Per pool (services.migration.lownodeload_args), in order: the pool's nodes (all for a pool without selector, else
the matching ones that were not node-level sources of an earlier pool that reached eviction), the thresholds with
every resource filled in (`new_thresholds`, which writes into the pool's maps as Go does), each usable node's
usage and prod usage from its NodeMetric, its absolute thresholds (fixed or deviation), the five classes, the
gates and the anomaly detectors, then the node pass (abnormal high nodes, all pods, into low + bothLow nodes) and
the prod pass (abnormal prodHigh nodes, prod pods, into prodLow + bothLow nodes) with their budgets, nodeFit
reservations, pod order, stop conditions and eviction reasons (services.migration.lownodeload_util).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from schemas import kube
from schemas.scheduling import SchedulingNode, SchedulingPod
from schemas.selectors import LabelSelector, selector_matches
from services.migration import anomaly
from services.migration import lownodeload_util as util
from services.migration.lownodeload_args import LowNodeLoadArgs, NodePool, Thresholds
from services.migration.lownodeload_util import Amounts

CLASSES = ("lowNodes", "highNodes", "prodLowNodes", "prodHighNodes", "bothLowNodes")


@dataclass(frozen=True)
class NodeMetricView:
    """What the plugin reads of a NodeMetric."""

    update_time: Fraction | None
    has_node_metric: bool
    system_usage: Amounts
    pods: Sequence[tuple[str, Amounts]]
    """(namespace/name, podUsage) per podsMetric entry, in order."""


@dataclass
class NodeState:
    """A usable node of a pool: usages (changed by reservations and evictions) and absolute thresholds."""

    node: SchedulingNode
    allocatable: Amounts
    all_pods: list[SchedulingPod]
    prod_pods: list[SchedulingPod]
    usage: Amounts
    prod_usage: Amounts
    pod_metrics: dict[str, Amounts]
    low: Amounts = field(default_factory=dict)
    high: Amounts = field(default_factory=dict)
    prod_low: Amounts = field(default_factory=dict)
    prod_high: Amounts = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.node.metadata.name


@dataclass(frozen=True)
class Limits:
    per_node: int | None = None
    per_namespace: int | None = None
    total: int | None = None


@dataclass
class Evictor:
    """The descheduler's eviction limiter (totals per node, per namespace and overall)."""

    limits: Limits
    total: int = 0
    by_node: dict[str, int] = field(default_factory=dict)
    by_namespace: dict[str, int] = field(default_factory=dict)

    def evict(self, pod: kube.Pod) -> bool:
        node, namespace = pod.spec.node_name, pod.metadata.namespace
        if self.limits.total is not None and self.total + 1 > self.limits.total:
            return False
        if node and self.limits.per_node is not None and self.by_node.get(node, 0) + 1 > self.limits.per_node:
            return False
        per_namespace = self.limits.per_namespace
        if per_namespace is not None and self.by_namespace.get(namespace, 0) + 1 > per_namespace:
            return False
        self.total += 1
        if node:
            self.by_node[node] = self.by_node.get(node, 0) + 1
        self.by_namespace[namespace] = self.by_namespace.get(namespace, 0) + 1
        return True


@dataclass(frozen=True)
class Eviction:
    pod: str
    node: str
    prod: bool
    pool: str
    reason: str


@dataclass(frozen=True)
class NodeLoad:
    """A usable node's figures as the pool classified it (before any eviction of the round changed its usage)."""

    name: str
    allocatable: Amounts
    usage: Amounts
    prod_usage: Amounts
    low: Amounts
    high: Amounts
    prod_low: Amounts
    prod_high: Amounts


@dataclass
class PoolResult:
    name: str
    nodes: list[str]
    classes: dict[str, list[str]] = field(default_factory=lambda: {c: [] for c in CLASSES})
    abnormal_nodes: list[str] = field(default_factory=list)
    abnormal_prod_nodes: list[str] = field(default_factory=list)
    loads: list[NodeLoad] = field(default_factory=list)
    unusable: dict[str, str] = field(default_factory=dict)
    """The pool's nodes the round could not use, with why (no NodeMetric, or one too old)."""
    outcome: str = ""
    """Why the pool's round ended where it did, in a sentence (for the descheduler's view)."""


@dataclass
class Round:
    """Everything one round reads and changes."""

    args: LowNodeLoadArgs
    nodes: Sequence[SchedulingNode]
    metrics: Mapping[str, NodeMetricView]
    pods_on: Mapping[str, list[SchedulingPod]]
    now: Fraction
    evictor: Evictor
    detectors: MutableMapping[str, anomaly.Detector]
    prod_detectors: MutableMapping[str, anomaly.Detector]
    evictions: list[Eviction] = field(default_factory=list)
    pools: list[PoolResult] = field(default_factory=list)


def pods_by_node(pods: Sequence[SchedulingPod]) -> dict[str, list[SchedulingPod]]:
    """Each node's pods in input order, without the Succeeded and Failed ones."""
    out: dict[str, list[SchedulingPod]] = {}
    for pod in pods:
        if pod.spec.node_name and pod.status.phase not in (kube.PHASE_SUCCEEDED, kube.PHASE_FAILED):
            out.setdefault(pod.spec.node_name, []).append(pod)
    return out


def filter_nodes(
    pool_selector: LabelSelector | None, nodes: Sequence[SchedulingNode], processed: set[str]
) -> list[SchedulingNode]:
    """filterNodes: every node for a nil selector, else the matching nodes not yet processed."""
    if pool_selector is None:
        return list(nodes)
    return [n for n in nodes if n.metadata.name not in processed and selector_matches(pool_selector, n.metadata.labels)]


def new_thresholds(
    deviation: bool,
    low: Thresholds | None,
    high: Thresholds | None,
    prod_low: Thresholds | None,
    prod_high: Thresholds | None,
) -> tuple[Thresholds, Thresholds, Thresholds, Thresholds, list[str]]:
    """newThresholds: every resource of the four maps and memory gets low = high (and prodLow = prodHigh) = 100, or 0
    with deviation thresholds, when the low (prodLow) map lacks it. The given maps are written into, as in Go.
    Returns the four maps and the resource names (the low map's keys)."""
    names: list[str] = []
    for source in (low, high, prod_low, prod_high):
        names += list(source or {})
    names.append(util.MEMORY)
    low = {} if low is None else low
    high = {} if high is None else high
    prod_low = {} if prod_low is None else prod_low
    prod_high = {} if prod_high is None else prod_high
    fill = 0.0 if deviation else 100.0
    for name in names:
        if name not in low:
            low[name] = high[name] = fill
        if name not in prod_low:
            prod_low[name] = prod_high[name] = fill
    return low, high, prod_low, prod_high, list(low)


def unusable_reason(rnd: Round, node: SchedulingNode) -> str | None:
    """Why getNodeUsage leaves the node out (no NodeMetric with a nodeMetric, or one at or past its expiration);
    None for a usable node."""
    metric = rnd.metrics.get(node.metadata.name)
    if metric is None or not metric.has_node_metric:
        return "no NodeMetric with a nodeMetric"
    expiration = rnd.args.expiration_seconds
    if metric.update_time is None:
        return "its NodeMetric has no updateTime"
    if expiration > 0 and rnd.now - metric.update_time >= expiration:
        return f"its NodeMetric is {float(rnd.now - metric.update_time):.0f} s old (expiration {expiration} s)"
    return None


def node_states(rnd: Round, nodes: Sequence[SchedulingNode], names: Sequence[str]) -> list[NodeState]:
    """getNodeUsage: usable nodes (fresh NodeMetric with a nodeMetric) with their usages, in node order."""
    states = []
    for node in nodes:
        if unusable_reason(rnd, node) is not None:
            continue
        pods = rnd.pods_on.get(node.metadata.name, [])
        prod_pods = [p for p in pods if util.is_prod(p)]
        prod_keys = {kube.pod_key(p) for p in prod_pods}
        metric = rnd.metrics[node.metadata.name]
        usage: Amounts = {}
        prod_usage: Amounts = {}
        for name in names:
            zero = Fraction(0)
            pods_sum = sum((u.get(name, zero) for _, u in metric.pods), zero)
            usage[name] = metric.system_usage.get(name, zero) + pods_sum
            prod_usage[name] = sum((u.get(name, zero) for k, u in metric.pods if k in prod_keys), zero)
        usage[util.PODS] = Fraction(len(pods))
        prod_usage[util.PODS] = Fraction(len(prod_pods))
        states.append(
            NodeState(
                node=node,
                allocatable=util.raw_allocatable(node),
                all_pods=pods,
                prod_pods=prod_pods,
                usage=usage,
                prod_usage=prod_usage,
                pod_metrics=dict(metric.pods),
            )
        )
    return states


def average_percentages(states: Sequence[NodeState], prod: bool) -> dict[str, float]:
    """calcAverageResourceUsagePercent: Σ used/alloc × 100 over nodes with alloc ≠ 0, ÷ the count of all nodes."""
    totals: dict[str, float] = {}
    for state in states:
        for name, used in (state.prod_usage if prod else state.usage).items():
            cap = state.allocatable.get(name, Fraction(0))
            if cap == 0:
                continue
            if name == util.CPU:
                share = float(util.milli(used)) / float(util.milli(cap)) * 100.0
            else:
                share = float(util.whole(used)) / float(util.whole(cap)) * 100.0
            totals[name] = totals.get(name, 0.0) + share
    return {name: total / float(len(states)) for name, total in totals.items()}


def _clamp(percent: float) -> float:
    return min(max(percent, 0.0), 100.0)


def set_thresholds(
    states: Sequence[NodeState],
    pcts: tuple[Thresholds, Thresholds, Thresholds, Thresholds],
    names: Sequence[str],
    deviation: bool,
) -> None:
    """getNodeThresholds: each node's absolute low/high/prodLow/prodHigh per resource (a missing percent is 0)."""
    low, high, prod_low, prod_high = pcts
    average = average_percentages(states, False) if deviation else {}
    prod_average = average_percentages(states, True) if deviation else {}
    for state in states:
        alloc = state.allocatable

        def at(name: str, percent: float, a: Mapping[str, Fraction] = alloc) -> Fraction:
            return util.absolute_threshold(a, name, percent)

        for name in names:
            if not deviation:
                state.low[name], state.high[name] = at(name, low.get(name, 0.0)), at(name, high.get(name, 0.0))
                state.prod_low[name] = at(name, prod_low.get(name, 0.0))
                state.prod_high[name] = at(name, prod_high.get(name, 0.0))
                continue
            cap = alloc.get(name, Fraction(0))
            if low.get(name, 0.0) == 0:
                state.low[name] = state.high[name] = cap
            else:
                state.low[name] = at(name, _clamp(average.get(name, 0.0) - low[name]))
                state.high[name] = at(name, _clamp(average.get(name, 0.0) + high.get(name, 0.0)))
            if prod_low.get(name, 0.0) == 0:
                state.prod_low[name] = state.prod_high[name] = cap
            else:
                state.prod_low[name] = at(name, _clamp(prod_average.get(name, 0.0) - prod_low[name]))
                state.prod_high[name] = at(name, _clamp(prod_average.get(name, 0.0) + prod_high.get(name, 0.0)))


def classify(states: Sequence[NodeState]) -> dict[str, list[NodeState]]:
    """classifyNodes (spec §11.4); an unschedulable node is never under a low threshold."""
    out: dict[str, list[NodeState]] = {c: [] for c in CLASSES}
    for s in states:
        schedulable = not s.node.spec.unschedulable
        prod_over = bool(util.over_resources(s.prod_usage, s.prod_high))
        prod_under = schedulable and util.is_under(s.prod_usage, s.prod_low)
        if schedulable and util.is_under(s.usage, s.low):
            out["prodHighNodes" if prod_over else "bothLowNodes" if prod_under else "lowNodes"].append(s)
        elif util.over_resources(s.usage, s.high):
            out["highNodes"].append(s)
        elif prod_over:
            out["prodHighNodes"].append(s)
        elif prod_under:
            out["prodLowNodes"].append(s)
    return out


def _available(targets: Sequence[NodeState], names: Sequence[str], prod: bool) -> Amounts:
    """targetAvailableUsage: Σ (high − usage), or Σ (prodHigh − prodUsage), per resource."""
    total = {name: Fraction(0) for name in names}
    for t in targets:
        for name in names:
            if prod:
                total[name] += t.prod_high[name] - t.prod_usage[name]
            else:
                total[name] += t.high[name] - t.usage[name]
    return total


def _sorted_sources(sources: Sequence[NodeState], weights: Mapping[str, int], prod: bool) -> list[NodeState]:
    """sortNodesByUsage, descending, stable."""
    return sorted(
        sources,
        key=lambda s: -util.node_usage_score(s.prod_usage if prod else s.usage, s.allocatable, weights),
    )


@dataclass
class _Pass:
    """One eviction pass of a pool (node or prod)."""

    rnd: Round
    pool: NodePool
    prod: bool
    names: Sequence[str]
    percents: tuple[Thresholds, Thresholds]
    """The pool's high and prodHigh percents (for the reasons)."""

    def candidates(self, src: NodeState, targets: Sequence[NodeState]) -> list[SchedulingPod]:
        args = self.rnd.args
        usages = {t.name: (t.prod_usage if self.prod else t.usage) for t in targets}
        thresholds = {t.name: (t.prod_high if self.prod else t.high) for t in targets}
        target_nodes = [t.node for t in targets]
        out = []
        for pod in src.prod_pods if self.prod else src.all_pods:
            if not _pod_filter(pod, args):
                continue
            if args.node_fit:
                metric = src.pod_metrics.get(kube.pod_key(pod))
                if metric is None:
                    continue
                if not util.pod_fits_any_node(pod, target_nodes, self.rnd.pods_on, usages, thresholds, metric):
                    continue
            out.append(pod)
        return out

    def keep_going(self, src: NodeState, budget: Amounts) -> bool:
        usage, thresholds = (src.prod_usage, src.prod_high) if self.prod else (src.usage, src.high)
        if not util.over_resources(usage, thresholds):
            detectors = self.rnd.prod_detectors if self.prod else self.rnd.detectors
            anomaly.reset_all([src.name], detectors, self.rnd.now)
            return False
        return all(budget[name] > 0 for name in self.names if name in budget)

    def run(self, sources: Sequence[NodeState], targets: Sequence[NodeState], budget: Amounts) -> None:
        """balancePods + evictPods."""
        if not targets:
            return
        weights = self.pool.weights or {}
        for src in sources:
            removable = self.candidates(src, targets)
            if not removable:
                continue
            usage, thresholds = (src.prod_usage, src.prod_high) if self.prod else (src.usage, src.high)
            exceeding = {name: usage[name] - thresholds[name] for name in util.over_resources(usage, thresholds)}
            for pod in util.sort_pods(removable, src.pod_metrics, exceeding, weights):
                if not self.keep_going(src, budget):
                    break
                self.evict(src, pod, budget)

    def evict(self, src: NodeState, pod: SchedulingPod, budget: Amounts) -> None:
        rnd = self.rnd
        usage, thresholds = (src.prod_usage, src.prod_high) if self.prod else (src.usage, src.high)
        high, prod_high = self.percents
        reason = util.eviction_reason(self.prod, high, prod_high, usage, thresholds, src.allocatable)
        if not rnd.args.dry_run and not rnd.evictor.evict(pod):
            return
        rnd.evictions.append(Eviction(kube.pod_key(pod), src.name, self.prod, self.pool.name, reason))
        metric = src.pod_metrics.get(kube.pod_key(pod))
        if metric is None:
            return
        for name in budget:
            amount = Fraction(1) if name == util.PODS else metric.get(name, Fraction(0))
            budget[name] -= amount
            if name in src.usage:
                src.usage[name] -= amount
            if self.prod and name in src.prod_usage:
                src.prod_usage[name] -= amount


def _pod_filter(pod: SchedulingPod, args: LowNodeLoadArgs) -> bool:
    """The plugin's pod filter: the evictor, the pod selectors, the evictable namespaces."""
    namespace = pod.metadata.namespace
    if args.include_namespaces and namespace not in args.include_namespaces:
        return False
    if args.exclude_namespaces and namespace in args.exclude_namespaces:
        return False
    if util.evictor_refusal(pod) is not None:
        return False
    selectors = [s.selector for s in args.pod_selectors if s.selector is not None]
    return not selectors or any(selector_matches(s, pod.metadata.labels) for s in selectors)


def process_pool(rnd: Round, pool: NodePool, processed: set[str]) -> PoolResult:
    """processOneNodePool."""
    nodes = filter_nodes(pool.node_selector, rnd.nodes, processed)
    result = PoolResult(pool.name, [n.metadata.name for n in nodes])
    if not nodes:
        result.outcome = "no node in the pool"
        return result
    low, high, prod_low, prod_high, names = new_thresholds(
        pool.use_deviation_thresholds, pool.low, pool.high, pool.prod_low, pool.prod_high
    )
    states = node_states(rnd, nodes, names)
    set_thresholds(states, (low, high, prod_low, prod_high), names, pool.use_deviation_thresholds)
    classes = classify(states)
    result.classes = {c: [s.name for s in members] for c, members in classes.items()}
    result.loads = [_load(s) for s in states]
    result.unusable = {n.metadata.name: why for n in nodes if (why := unusable_reason(rnd, n)) is not None}
    lows, sources, prod_lows = classes["lowNodes"], classes["highNodes"], classes["prodLowNodes"]
    prod_sources, both_lows = classes["prodHighNodes"], classes["bothLowNodes"]
    if not sources and not prod_sources:
        result.outcome = "no node over its high or prodHigh thresholds"
        return result
    abnormal = _abnormal(rnd, pool, sources, rnd.detectors)
    abnormal_prod = _abnormal(rnd, pool, prod_sources, rnd.prod_detectors)
    result.abnormal_nodes = [s.name for s in abnormal]
    result.abnormal_prod_nodes = [s.name for s in abnormal_prod]
    if not abnormal and not abnormal_prod:
        rounds = pool.condition.consecutive_abnormalities if pool.condition is not None else 0
        result.outcome = (
            f"{len(sources) + len(prod_sources)} node(s) over their thresholds, none abnormal yet "
            f"({rounds} consecutive rounds over make a node abnormal)"
        )
        return result
    all_lows = len(lows) + len(prod_lows) + len(both_lows)
    if all_lows == 0:
        result.outcome = "no node under its low thresholds to move pods to"
        return result
    anomaly.reset_all([s.name for s in lows + both_lows], rnd.detectors, rnd.now)
    anomaly.reset_all([s.name for s in prod_lows], rnd.prod_detectors, rnd.now)
    if all_lows <= rnd.args.number_of_nodes:
        result.outcome = f"{all_lows} low node(s), not more than numberOfNodes ({rnd.args.number_of_nodes})"
        return result
    if all_lows == len(nodes):
        result.outcome = "every node of the pool is low"
        return result
    before = len(rnd.evictions)
    weights = pool.weights or {}
    node_pass = _Pass(rnd, pool, False, names, (high, prod_high))
    prod_pass = _Pass(rnd, pool, True, names, (high, prod_high))
    low_available = _available(lows, names, False)
    both_available = _available(both_lows, names, False)
    node_budget = {name: low_available[name] + both_available[name] for name in names}
    prod_available = _available(prod_lows, names, True)
    prod_both_available = _available(both_lows, names, True)
    node_pass.run(_sorted_sources(abnormal, weights, False), lows + both_lows, node_budget)
    prod_budget = {}
    for name in names:
        both_left = min(both_available[name], node_budget[name])
        prod_budget[name] = prod_available[name] + min(prod_both_available[name], both_left)
    prod_pass.run(_sorted_sources(abnormal_prod, weights, True), prod_lows + both_lows, prod_budget)
    anomaly.mark_normal(result.abnormal_nodes, rnd.detectors, rnd.now)
    anomaly.mark_normal(result.abnormal_prod_nodes, rnd.prod_detectors, rnd.now)
    processed.update(s.name for s in sources)
    evicted = len(rnd.evictions) - before
    result.outcome = (
        f"{evicted} pod(s) to move off the abnormal node(s)"
        if evicted
        else "no pod of the abnormal node(s) could move (filters, nodeFit, limits or budget)"
    )
    return result


def _load(state: NodeState) -> NodeLoad:
    return NodeLoad(
        name=state.name,
        allocatable=dict(state.allocatable),
        usage=dict(state.usage),
        prod_usage=dict(state.prod_usage),
        low=dict(state.low),
        high=dict(state.high),
        prod_low=dict(state.prod_low),
        prod_high=dict(state.prod_high),
    )


def _abnormal(
    rnd: Round, pool: NodePool, sources: Sequence[NodeState], detectors: MutableMapping[str, anomaly.Detector]
) -> list[NodeState]:
    condition = pool.condition
    if condition is None:
        return list(sources)
    names = anomaly.filter_abnormal(
        [s.name for s in sources],
        detectors,
        condition.consecutive_abnormalities,
        condition.consecutive_normalities,
        condition.timeout_seconds,
        rnd.now,
    )
    wanted = set(names)
    return [s for s in sources if s.name in wanted]


def balance(rnd: Round) -> Round:
    """The whole round: every pool in order (nothing when paused)."""
    if rnd.args.paused:
        return rnd
    processed: set[str] = set()
    for pool in rnd.args.pools:
        rnd.pools.append(process_pool(rnd, pool, processed))
    return rnd
