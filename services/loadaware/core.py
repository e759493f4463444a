"""Filter (spec §6.5) and score (§6.6) of one pod on one node, from LoadState. Pure: `now` is a parameter.

`incoming` reads what the calculations need of the pod being scheduled once per request (its estimate, whether it
is koord-prod, whether a DaemonSet owns it). `filter_node` returns a `Verdict` with Koordinator's reason on a
failure; `score_node` a 0–100 `Score`, and `extender_score` scales it to the extender API's 0–10. With
`explain=True` both carry their arithmetic (`cpu 48% = (usage 12000 + assigned 0 + pod 3400) / 32000 ≤ 65`).

Where this deliberately differs from Koordinator (each covered by a test):
* A node the extender knows nothing about (no Node, no NodeMetric) passes with score 0 and the reason "unknown
  node", instead of being treated like a node without NodeMetric silently: kube-scheduler may ask about nodes the
  bridge has not reported yet, and the operator should see why such a node was not ranked.
* An empty node usage in a NodeMetric is "no data" (our ResourceMap's convention): the estimate then starts from
  the sum of the assigned pods' estimates, as Koordinator does for a nil usage, rather than from zero, which would
  make a node whose agent reported nothing look idle and attract every pod of a burst.
Used by the loadaware service's HTTP routes and `koordbus scheduler explain`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from schemas import kube, resources, vocab
from services.loadaware import estimator
from services.loadaware.args import LoadAwareArgs, duration_seconds
from services.loadaware.state import LoadState, MetricView, NodeEntry, NodeLoad, Overrides
from services.slo import watermarks

ResourceList = resources.ResourceList
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10

REASON_EXPIRED = "node(s) nodeMetric expired"
REASON_UNKNOWN = "unknown node"


@dataclass(frozen=True, slots=True)
class IncomingPod:
    key: str
    estimated: ResourceList
    prod: bool
    daemonset: bool
    eviction: watermarks.EvictionFacts | None = None
    """What node QoS eviction looks at (None: a pod it never evicts)."""


def incoming(pod: kube.Pod, args: LoadAwareArgs) -> IncomingPod:
    return IncomingPod(
        key=kube.pod_key(pod),
        estimated=estimator.estimate_pod(pod, args),
        prod=kube.pod_priority_class(pod) == vocab.PRIORITY_PROD,
        daemonset=any(ref.kind == "DaemonSet" for ref in pod.metadata.owner_references),
        eviction=watermarks.eviction_facts(pod.metadata.labels, pod.spec.priority),
    )


def eviction_caps(state: LoadState, pod: IncomingPod, entry: NodeEntry | None) -> dict[str, int]:
    """The caps node QoS eviction puts on this pod's thresholds on this node (services.slo.watermarks)."""
    if entry is None or pod.eviction is None or not state.avoid_eviction_loops:
        return {}
    return watermarks.eviction_caps(state.qos_strategies[entry.qos_strategy], pod.eviction)


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    reason: str = ""
    """Koordinator's reason when it fails; why the node was not checked when it passes unchecked."""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Score:
    score: int
    """0..MAX_NODE_SCORE."""
    reason: str = ""
    detail: str = ""


@dataclass(frozen=True, slots=True)
class Profile:
    thresholds: Mapping[str, int]
    aggregation: tuple[str, int] | None
    """(type, seconds; 0 = the longest) when the thresholds are on aggregated usage."""
    prod: bool


def filter_profile(args: LoadAwareArgs, overrides: Overrides | None, *, prod: bool) -> Profile:
    """Which thresholds apply (§6.5 step 2), each non-empty section of the node's annotation replacing the args'."""
    usage = (overrides.usage_thresholds if overrides else {}) or args.usage_thresholds
    prod_thresholds = (overrides.prod_usage_thresholds if overrides else {}) or args.prod_usage_thresholds
    if prod and prod_thresholds:
        return Profile(thresholds=prod_thresholds, aggregation=None, prod=True)
    if overrides is not None and overrides.aggregation_type:
        aggregation = (overrides.aggregation_type, overrides.aggregated_seconds)
        return Profile(thresholds=overrides.aggregated_thresholds, aggregation=aggregation, prod=False)
    agg = args.aggregated
    if agg is not None and agg.usage_thresholds and agg.usage_aggregation_type:
        aggregation = (agg.usage_aggregation_type, duration_seconds(agg.usage_aggregated_duration))
        return Profile(thresholds=agg.usage_thresholds, aggregation=aggregation, prod=False)
    return Profile(thresholds=usage, aggregation=None, prod=False)


def expired(metric: MetricView, args: LoadAwareArgs, *, now: float) -> bool:
    return now - metric.update_time >= args.node_metric_expiration_seconds


@dataclass(frozen=True, slots=True)
class Estimate:
    total: ResourceList
    base: ResourceList
    base_name: str
    assigned: ResourceList


def estimate(
    metric: MetricView, load: NodeLoad, pod: IncomingPod, *, prod: bool, aggregation: tuple[str, int] | None
) -> Estimate:
    """§6.5 step 6: what the node would use with the pod on it, and where the figure started from."""
    if prod:
        base, name, assigned = load.prod_usage, "prod usage", load.prod_delta
    else:
        usage = metric.node_usage
        name = "usage"
        if aggregation is not None:
            kind, seconds = aggregation
            name = f"{kind} usage over {seconds or 'the longest'}{'s' if seconds else ''}"
            usage = metric.aggregated.get(aggregation)
            if usage is None and seconds == 0:
                usage, name = metric.node_usage, "usage"
        if usage is not None:
            base, assigned = usage, load.node_delta
        else:
            base, name, assigned = {}, "estimates of assigned pods", load.node_estimated
    return Estimate(
        total=resources.add(resources.add(base, assigned), pod.estimated), base=base, base_name=name, assigned=assigned
    )


def _round_percent(used: int, total: int) -> int:
    """Go's math.Round(used / total × 100) for non-negative amounts."""
    return (200 * used + total) // (2 * total)


def filter_node(
    state: LoadState,
    pod: IncomingPod,
    node: str,
    *,
    now: float,
    allocatable: ResourceList | None = None,
    explain: bool = False,
) -> Verdict:
    """§6.5. `allocatable` is the request's own Node object when kube-scheduler sent one (nodeCacheCapable false)."""
    args = state.args
    if pod.daemonset:
        return Verdict(passed=True, reason="DaemonSet pods always pass")
    entry = state.nodes.get(node)
    if entry is None and allocatable is None:
        return Verdict(passed=True, reason=REASON_UNKNOWN)
    profile = filter_profile(args, entry.overrides if entry else None, prod=pod.prod)
    caps = eviction_caps(state, pod, entry)
    thresholds = watermarks.capped(profile.thresholds, caps)
    if not any(thresholds.values()):
        return Verdict(passed=True, reason="no thresholds")
    metric = entry.metric if entry else None
    load = state.load_of(node)
    if metric is None or load is None:
        return Verdict(passed=True, reason="no NodeMetric")
    if args.filter_expired_node_metrics and expired(metric, args, now=now):
        if args.enable_schedule_when_node_metrics_expired:
            return Verdict(passed=True, reason="nodeMetric expired, scheduling allowed")
        age = now - metric.update_time
        detail = f"updated {age:.0f} s ago ≥ {args.node_metric_expiration_seconds} s" if explain else ""
        return Verdict(passed=False, reason=REASON_EXPIRED, detail=detail)
    capacity = allocatable if allocatable is not None else (entry.allocatable if entry else None) or {}
    est = estimate(metric, load, pod, prod=profile.prod, aggregation=profile.aggregation)
    lines: list[str] = []
    for name in sorted(thresholds):
        threshold, total = thresholds[name], capacity.get(name, 0)
        if threshold == 0 or total == 0:
            continue
        used = est.total.get(name, 0)
        percent = _round_percent(used, total)
        if explain:
            why = f" (capped: node QoS evicts this pod at {caps[name] + 1}%)" if threshold == caps.get(name) else ""
            lines.append(
                f"{name} {percent}% = ({est.base_name} {est.base.get(name, 0)} + assigned {est.assigned.get(name, 0)}"
                f" + pod {pod.estimated.get(name, 0)}) / {total} {'>' if percent > threshold else '≤'} {threshold}"
                + why
            )
        if percent > threshold:
            kind = "aggregated usage" if profile.aggregation is not None else "usage"
            return Verdict(passed=False, reason=f"node(s) {name} {kind} exceed threshold", detail="; ".join(lines))
    return Verdict(passed=True, detail="; ".join(lines))


def score_node(
    state: LoadState,
    pod: IncomingPod,
    node: str,
    *,
    now: float,
    allocatable: ResourceList | None = None,
    explain: bool = False,
) -> Score:
    """§6.6: the weighted mean of per-resource free shares, plus the dominant (smallest) share if weighted."""
    args = state.args
    weights, dominant = args.resource_weights, args.dominant_resource_weight
    if not weights and dominant == 0:
        return Score(score=0, reason="no score weights")
    entry = state.nodes.get(node)
    if entry is None and allocatable is None:
        return Score(score=0, reason=REASON_UNKNOWN)
    metric = entry.metric if entry else None
    load = state.load_of(node)
    if metric is None or load is None:
        return Score(score=0, reason="no NodeMetric")
    if expired(metric, args, now=now):
        return Score(score=0, reason=REASON_EXPIRED)
    prod = args.score_according_prod_usage and pod.prod
    aggregation = None
    if not prod and args.aggregated is not None and args.aggregated.score_aggregation_type:
        agg = args.aggregated
        aggregation = (agg.score_aggregation_type, duration_seconds(agg.score_aggregated_duration))
    est = estimate(metric, load, pod, prod=prod, aggregation=aggregation)
    capacity = allocatable if allocatable is not None else (entry.allocatable if entry else None) or {}
    shares = {}
    for name in state.vector:
        total, used = capacity.get(name, 0), est.total.get(name, 0)
        shares[name] = (total - used) * MAX_NODE_SCORE // total if total > 0 and used <= total else 0
    weighted = sum(shares[name] * weight for name, weight in weights.items() if name in shares)
    smallest = min(shares.values()) if shares else 0
    denominator = sum(weights.values()) + dominant
    score = (weighted + dominant * smallest) // denominator if denominator > 0 else 0
    detail = ""
    if explain:
        parts = [f"{name} {shares[name]}×{weights.get(name, 0)}" for name in state.vector]
        detail = f"score {score} = ({' + '.join(parts)} + dominant {dominant}×{smallest}) / {denominator}"
        detail += "; " + ", ".join(f"{n} {est.total.get(n, 0)}/{capacity.get(n, 0)}" for n in state.vector)
    return Score(score=score, detail=detail)


def extender_score(score: int) -> int:
    """0..100 → the extender API's 0..10, rounded half up (kube-scheduler multiplies it back by 10 × weight)."""
    return (score * MAX_EXTENDER_PRIORITY + MAX_NODE_SCORE // 2) // MAX_NODE_SCORE
