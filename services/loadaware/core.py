"""Filter (spec §6.5) and score (§6.6) of one pod on one node, from LoadState. Pure: `now` is a parameter.

`incoming` reads what the calculations need of the pod being scheduled once per request (its estimate, whether it
is koord-prod, whether a DaemonSet owns it). `filter_node` returns a `Verdict` with Koordinator's reason on a
failure; `score_node` a 0–100 `Score`, and `extender_score` scales it to the extender API's 0–10. Both carry the
estimated usage they compared (existing pods plus the incoming one, on the resource vector), and with
`explain=True` their arithmetic (`cpu 48% = (usage 12000 + assigned 0 + pod 3400) / 32000 ≤ 65`). Every
calculation reads only the resources of the vector (LoadAwareArgs.vector), as Koordinator's does; the percentages
are Go's float64 `math.Round(est / allocatable × 100)`.

Where this deliberately differs from Koordinator (each covered by a test):
* A node the extender knows nothing about (no Node, no NodeMetric) passes with score 0 and the reason "unknown
  node", instead of being treated like a node without NodeMetric silently: kube-scheduler may ask about nodes the
  bridge has not reported yet, and the operator should see why such a node was not ranked.
* An empty node usage in our NodeMetric report is "no data" (services.loadaware.state.metric_view).
* With node QoS strategies (the slo-controller-config's resource-threshold-config), a pod the node's agent could
  evict has its threshold capped under the agent's eviction threshold (services.common.watermarks); without them,
  as in `koordbus calc loadaware`, nothing is capped.
Used by the loadaware service's verbs, services.loadaware.snapshot (`koordbus calc loadaware`, `koordbus scheduler
explain --offline`) and services.loadaware.fast, which must answer the same.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass

from schemas import kube, resources, vocab
from services.common import watermarks
from services.common.args import duration_seconds
from services.loadaware import estimator
from services.loadaware.args import LoadAwareArgs
from services.loadaware.state import AggregationKey, LoadState, MetricView, NodeEntry, NodeLoad, Overrides

ResourceList = resources.ResourceList
MAX_NODE_SCORE = 100
MAX_EXTENDER_PRIORITY = 10

REASON_EXPIRED = "node(s) nodeMetric expired"
REASON_UNKNOWN = "unknown node"
REASON_NO_NODE_METRIC_STATUS = "the NodeMetric has no status.nodeMetric"


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
    """The caps node QoS eviction puts on this pod's thresholds on this node (services.common.watermarks)."""
    if entry is None or pod.eviction is None or not state.avoid_eviction_loops:
        return {}
    return watermarks.eviction_caps(state.qos_strategies[entry.qos_strategy], pod.eviction)


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    reason: str = ""
    """Koordinator's reason when it fails; why the node was not checked when it passes unchecked."""
    detail: str = ""
    estimated: ResourceList | None = None
    """The estimated usage compared with the thresholds (on the vector); None when nothing was compared."""


@dataclass(frozen=True, slots=True)
class Score:
    score: int
    """0..MAX_NODE_SCORE."""
    reason: str = ""
    detail: str = ""
    estimated: ResourceList | None = None
    """The estimated usage scored (on the vector); None when the score returned before (0)."""


@dataclass(frozen=True, slots=True)
class Profile:
    thresholds: Mapping[str, int]
    aggregation: AggregationKey | None
    """(type, seconds; 0 = the longest) when the thresholds are on aggregated usage."""
    prod: bool


def filter_profile(
    args: LoadAwareArgs, overrides: Overrides | None, *, prod: bool, vector: Collection[str] | None = None
) -> Profile:
    """Which thresholds apply (§6.5 step 2), each non-empty section of the node's annotation replacing the args'.
    A prod pod takes the prod thresholds when they check some resource of the vector; else the aggregated profile
    (the annotation's, else the args' when it has thresholds and a type); else the usage thresholds."""
    names = args.vector() if vector is None else vector
    usage = (overrides.usage_thresholds if overrides else {}) or args.usage_thresholds
    prod_thresholds = (overrides.prod_usage_thresholds if overrides else {}) or args.prod_usage_thresholds
    if prod and any(prod_thresholds.get(name) for name in names):
        return Profile(thresholds=prod_thresholds, aggregation=None, prod=True)
    if overrides is not None and overrides.aggregation_type:
        aggregation = (overrides.aggregation_type, overrides.aggregated_seconds)
        return Profile(thresholds=overrides.aggregated_thresholds, aggregation=aggregation, prod=False)
    agg = args.aggregated
    if agg is not None and agg.usage_thresholds and agg.usage_aggregation_type:
        aggregation = (agg.usage_aggregation_type, duration_seconds(agg.usage_aggregated_duration))
        return Profile(thresholds=agg.usage_thresholds, aggregation=aggregation, prod=False)
    return Profile(thresholds=usage, aggregation=None, prod=False)


def score_aggregation(args: LoadAwareArgs) -> AggregationKey | None:
    """The aggregated usage the score reads for a pod not scored on prod usage; None: the node usage."""
    agg = args.aggregated
    if agg is None or not agg.score_aggregation_type:
        return None
    return (agg.score_aggregation_type, duration_seconds(agg.score_aggregated_duration))


def expired(metric: MetricView, args: LoadAwareArgs, *, now: float) -> bool:
    """No updateTime, or at least nodeMetricExpirationSeconds old."""
    return metric.update_time is None or now - metric.update_time >= args.node_metric_expiration_seconds


def on_vector(amounts: Mapping[str, int], vector: Iterable[str]) -> ResourceList:
    """Every resource of the vector (0 where `amounts` has none), nothing else."""
    return {name: amounts.get(name, 0) for name in vector}


@dataclass(frozen=True, slots=True)
class Estimate:
    total: ResourceList
    base: ResourceList
    base_name: str
    assigned: ResourceList


def estimate(
    metric: MetricView, load: NodeLoad, pod: IncomingPod, *, prod: bool, aggregation: AggregationKey | None
) -> Estimate:
    """§6.5 step 6: what the node would use with the pod on it, and where the figure started from."""
    if prod:
        base, name, assigned = load.prod_usage, "prod usage", load.prod_delta
    else:
        usage = metric.node_usage
        name = "usage"
        if aggregation is not None:
            kind, seconds = aggregation
            name = f"{kind} usage over {f'{float(seconds):g}s' if seconds else 'the longest'}"
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


def percent(used: int, total: int) -> int:
    """Koordinator's `int64(math.Round(float64(used) / float64(total) * 100))`, in float64 as Go computes it."""
    return int(estimator.go_round(float(used) / float(total) * 100))


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
    args, vector = state.args, state.vector
    if pod.daemonset:
        return Verdict(passed=True, reason="DaemonSet pods always pass")
    entry = state.nodes.get(node)
    if entry is None and allocatable is None:
        return Verdict(passed=True, reason=REASON_UNKNOWN)
    profile = filter_profile(args, entry.overrides if entry else None, prod=pod.prod, vector=vector)
    caps = eviction_caps(state, pod, entry)
    thresholds = watermarks.capped(profile.thresholds, caps)
    if not any(thresholds.get(name) for name in vector):
        return Verdict(passed=True, reason="no thresholds")
    metric = entry.metric if entry else None
    load = state.load_of(node)
    if metric is None or load is None:
        return Verdict(passed=True, reason="no NodeMetric")
    if args.filter_expired_node_metrics and expired(metric, args, now=now):
        if args.enable_schedule_when_node_metrics_expired:
            return Verdict(passed=True, reason="nodeMetric expired, scheduling allowed")
        detail = ""
        if explain:
            updated = "no updateTime" if metric.update_time is None else f"updated {now - metric.update_time:.0f} s ago"
            detail = f"{updated} ≥ {args.node_metric_expiration_seconds} s"
        return Verdict(passed=False, reason=REASON_EXPIRED, detail=detail)
    if not metric.has_node_metric:
        return Verdict(passed=True, reason=REASON_NO_NODE_METRIC_STATUS)
    capacity = allocatable if allocatable is not None else (entry.allocatable if entry else None) or {}
    est = estimate(metric, load, pod, prod=profile.prod, aggregation=profile.aggregation)
    compared = on_vector(est.total, vector)
    lines: list[str] = []
    for name in vector:
        threshold, total = thresholds.get(name, 0), capacity.get(name, 0)
        if threshold == 0 or total == 0:
            continue
        used = compared[name]
        usage = percent(used, total)
        if explain:
            why = f" (capped: node QoS evicts this pod at {caps[name] + 1}%)" if threshold == caps.get(name) else ""
            lines.append(
                f"{name} {usage}% = ({est.base_name} {est.base.get(name, 0)} + assigned {est.assigned.get(name, 0)}"
                f" + pod {pod.estimated.get(name, 0)}) / {total} {'>' if usage > threshold else '≤'} {threshold}" + why
            )
        if usage > threshold:
            kind = "aggregated usage" if profile.aggregation is not None else "usage"
            return Verdict(
                passed=False,
                reason=f"node(s) {name} {kind} exceed threshold",
                detail="; ".join(lines),
                estimated=compared,
            )
    return Verdict(passed=True, detail="; ".join(lines), estimated=compared)


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
    args, vector = state.args, state.vector
    weights = on_vector(args.resource_weights, vector)
    dominant = args.dominant_resource_weight
    if not any(weights.values()) and dominant == 0:
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
    if not metric.has_node_metric:
        return Score(score=0, reason=REASON_NO_NODE_METRIC_STATUS)
    prod = args.score_according_prod_usage and pod.prod
    est = estimate(metric, load, pod, prod=prod, aggregation=None if prod else score_aggregation(args))
    compared = on_vector(est.total, vector)
    capacity = allocatable if allocatable is not None else (entry.allocatable if entry else None) or {}
    shares = {}
    for name in vector:
        total, used = capacity.get(name, 0), compared[name]
        shares[name] = (total - used) * MAX_NODE_SCORE // total if total > 0 and used <= total else 0
    weighted = sum(shares[name] * weights[name] for name in vector)
    smallest = min(shares.values())  # every share is 0..100; Koordinator's min starts at 100
    denominator = sum(weights.values()) + dominant
    score = (weighted + dominant * smallest) // denominator if denominator > 0 else 0
    detail = ""
    if explain:
        parts = [f"{name} {shares[name]}×{weights[name]}" for name in vector]
        detail = f"score {score} = ({' + '.join(parts)} + dominant {dominant}×{smallest}) / {denominator}"
        detail += "; " + ", ".join(f"{n} {compared[n]}/{capacity.get(n, 0)}" for n in vector)
    return Score(score=score, detail=detail, estimated=compared)


def extender_score(score: int) -> int:
    """0..100 → the extender API's 0..10, rounded half up (kube-scheduler multiplies it back by 10 × weight)."""
    return (score * MAX_EXTENDER_PRIORITY + MAX_NODE_SCORE // 2) // MAX_NODE_SCORE


def explain(state: LoadState, pod: kube.Pod, node: str, *, now: float) -> dict[str, object]:
    """The filter verdict and score of `pod` on `node` with their arithmetic: what `koordbus scheduler explain`
    prints, asked of a running extender or replayed from a saved state (services.loadaware.snapshot)."""
    incoming_pod = incoming(pod, state.args)
    verdict = filter_node(state, incoming_pod, node, now=now, explain=True)
    score = score_node(state, incoming_pod, node, now=now, explain=True)
    entry = state.nodes.get(node)
    return {
        "pod": incoming_pod.key,
        "node": node,
        "assigned_pods": len(entry.pods) if entry else 0,
        "nodemetric_update_time": entry.metric.update_time if entry and entry.metric else None,
        "estimate": incoming_pod.estimated,
        "filter": {"passed": verdict.passed, "reason": verdict.reason, "detail": verdict.detail},
        "score": {
            "score": score.score,
            "extender_score": extender_score(score.score),
            "reason": score.reason,
            "detail": score.detail,
        },
    }
