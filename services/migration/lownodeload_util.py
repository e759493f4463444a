"""The helpers of Koordinator's LowNodeLoad plugin (spec §11.3–11.6), each testable on its own. Pure.

Amounts are exact: a resource's amount is the Kubernetes Quantity's value as a Fraction (cores for cpu, bytes for
memory, a count for pods), added and compared exactly, and turned into integers only where Go does (`milli`:
MilliValue, `whole`: Value, `scaled`: MilliValue for cpu and Value otherwise). Here:

* `raw_allocatable` — the node's `node.koordinator.sh/raw-allocatable` annotation, else `status.allocatable`;
* `absolute_threshold` — `trunc(float64(pct) × 0.01 × float64(cap))` with cap = `scaled(allocatable)`;
* `usage_percentages` — `100 × MilliValue(usage) / MilliValue(allocatable)` for every usage key with allocatable;
* `node_usage_score` / `pod_usage_score` — the descheduler's ResourceUsageScorer (integer, ×1000) and
  ResourceUsageScorerPod (k, or 1/k + 1 from k = 1);
* `pod_order_key` — Koordinator's PodSorter (priority class, priority, kube QoS, koord QoS, deletion cost, eviction
  cost), then the usage score (highest first, pods without a metric last), then newest first;
* `evictor_refusal` — the DefaultEvictor's default protections, overridden by `descheduler.alpha.kubernetes.io/evict`;
* `node_fit` / `pod_fits_any_node` — the descheduler's NodeFit and the plugin's threshold-aware reservation.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from fractions import Fraction
from typing import Any, Final

from schemas import kube, migration, quantity, vocab
from schemas.scheduling import SchedulingNode, SchedulingPod, pod_matches_node_labels, tolerates_taints
from services.migration import order

Amounts = dict[str, Fraction]
"""Resource → exact quantity value."""

CPU: Final = "cpu"
MEMORY: Final = "memory"
PODS: Final = "pods"
RAW_ALLOCATABLE_ANNOTATION: Final = "node.koordinator.sh/raw-allocatable"
MIRROR_ANNOTATION: Final = "kubernetes.io/config.mirror"
SOURCE_ANNOTATION: Final = "kubernetes.io/config.source"
SYSTEM_CRITICAL_PRIORITY: Final = 2_000_000_000
_COST: Final = re.compile(r"-[0-9]+|0|[1-9][0-9]*")
_EPOCH: Final = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def _ceil_away(value: Fraction) -> int:
    return math.ceil(value) if value >= 0 else math.floor(value)


def milli(value: Fraction) -> int:
    """Quantity.MilliValue()."""
    return _ceil_away(value * 1000)


def whole(value: Fraction) -> int:
    """Quantity.Value()."""
    return _ceil_away(value)


def scaled(resource: str, value: Fraction) -> int:
    """MilliValue for cpu, Value for everything else (the descheduler's getResourceValue)."""
    return milli(value) if resource == CPU else whole(value)


def go_div(a: int, b: int) -> int:
    """Go's integer division (truncates toward zero)."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b > 0) else -q


def amounts(raw: Mapping[str, quantity.RawQuantity] | None) -> Amounts:
    """Exact values of a (decoded, hence valid) quantity map."""
    return {name: quantity.parse_quantity(q).value for name, q in (raw or {}).items()}


def seconds(moment: dt.datetime) -> Fraction:
    """Exact Unix seconds of a time (no offset means UTC)."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
    delta = aware - _EPOCH
    return Fraction(delta.days * 86400 + delta.seconds) + Fraction(delta.microseconds, 10**6)


def raw_allocatable(node: kube.Node) -> Amounts:
    """GetNodeRawAllocatableFromNode: the annotation as Go unmarshals it into a ResourceList (it replaces the whole
    list; `null` counts as absent), else status.allocatable (also when the annotation does not parse)."""
    text = node.metadata.annotations.get(RAW_ALLOCATABLE_ANNOTATION)
    if text is not None:
        try:
            decoded: Any = json.loads(text)
            if isinstance(decoded, dict):
                return {
                    name: Fraction(0) if q is None else quantity.parse_quantity(_quantity_text(q)).value
                    for name, q in decoded.items()
                }
        except (ValueError, TypeError):
            pass
    return amounts(node.status.allocatable)


def _quantity_text(q: Any) -> str | int | float:
    if isinstance(q, bool) or not isinstance(q, (str, int, float)):
        raise TypeError("not a quantity")
    return q.strip() if isinstance(q, str) else q


def absolute_threshold(allocatable: Mapping[str, Fraction], resource: str, percent: float) -> Fraction:
    """resourceThreshold: the percent of the allocatable, truncated to a whole millicore (cpu) or unit."""
    cap = scaled(resource, allocatable.get(resource, Fraction(0)))
    amount = int(float(percent) * 0.01 * float(cap))
    return Fraction(amount, 1000) if resource == CPU else Fraction(amount)


def over_resources(usage: Mapping[str, Fraction], thresholds: Mapping[str, Fraction]) -> list[str]:
    """isNodeOverutilized: the resources (among the thresholds') whose usage is above the threshold."""
    return [r for r, t in thresholds.items() if r in usage and usage[r] > t]


def is_under(usage: Mapping[str, Fraction], thresholds: Mapping[str, Fraction]) -> bool:
    return not over_resources(usage, thresholds)


def usage_percentages(usage: Mapping[str, Fraction], allocatable: Mapping[str, Fraction]) -> dict[str, float]:
    """resourceUsagePercentages: for every usage key whose allocatable is not zero."""
    out: dict[str, float] = {}
    for name, used in usage.items():
        cap = allocatable.get(name, Fraction(0))
        if cap != 0:
            out[name] = 100 * float(milli(used)) / float(milli(cap))
    return out


def _most_requested(requested: int, capacity: int) -> int:
    if capacity == 0:
        return 0
    return go_div(min(requested, capacity) * 1000, capacity)


def node_usage_score(
    usage: Mapping[str, Fraction], allocatable: Mapping[str, Fraction], weights: Mapping[str, int]
) -> int:
    """ResourceUsageScorer: the weighted integer mean over the usage keys of min(used, alloc) × 1000 / alloc."""
    total = weight_sum = 0
    for name, used in usage.items():
        weight = weights.get(name, 0)
        total += _most_requested(scaled(name, used), scaled(name, allocatable.get(name, Fraction(0)))) * weight
        weight_sum += weight
    return 0 if weight_sum == 0 else go_div(total, weight_sum)


def _most_requested_pod(requested: int, capacity: int) -> float:
    if capacity == 0:
        return 0.0
    ratio = float(requested) / float(capacity)
    return 1 / ratio + 1 if ratio >= 1 else ratio


def pod_usage_score(
    metric: Mapping[str, Fraction], exceeding: Mapping[str, Fraction], weights: Mapping[str, int]
) -> float:
    """ResourceUsageScorerPod over the pod's metric keys, against how far each resource is over its threshold."""
    total, weight_sum = 0.0, 0
    for name, used in metric.items():
        weight = weights.get(name, 0)
        total += _most_requested_pod(scaled(name, used), scaled(name, exceeding.get(name, Fraction(0)))) * weight
        weight_sum += weight
    return 0.0 if weight_sum == 0 else total / float(weight_sum)


def sort_nodes_by_usage(
    nodes: Sequence[tuple[str, Mapping[str, Fraction], Mapping[str, Fraction]]],
    weights: Mapping[str, int],
    *,
    ascending: bool,
) -> list[str]:
    """(name, usage, allocatable) ordered by node score (stable)."""
    scored = [(node_usage_score(usage, alloc, weights), name) for name, usage, alloc in nodes]
    ordered = sorted(scored, key=lambda item: item[0] if ascending else -item[0])
    return [name for _, name in ordered]


def _cost(annotations: Mapping[str, str], key: str) -> int:
    """GetDeletionCostFromPodAnnotations / GetEvictionCost: an int32 without a plus sign or leading zeros, else 0."""
    value = annotations.get(key)
    if value is None or _COST.fullmatch(value) is None:
        return 0
    number = int(value)
    return number if -(2**31) <= number < 2**31 else 0


def _creation(pod: kube.Pod) -> float:
    stamp = pod.metadata.creation_timestamp
    return float(seconds(stamp)) if stamp is not None else -math.inf


PodOrderKey = tuple[int, int, int, int, int, int, tuple[int, float], float]


def pod_order_key(pod: kube.Pod, usage_score: float | None) -> PodOrderKey:
    """Ascending = evicted first. `usage_score` None: the pod has no metric (it goes after those with one)."""
    return (
        order.PRIORITY_CLASS_RANK.get(kube.pod_priority_class(pod), order.NO_PRIORITY_CLASS_RANK),
        pod.spec.priority or 0,
        order.KUBE_QOS_RANK.get(kube.pod_kube_qos(pod), 0),
        order.KOORD_QOS_RANK.get(kube.pod_qos_class(pod), order.NO_KOORD_QOS_RANK),
        _cost(pod.metadata.annotations, migration.ANNOTATION_DELETION_COST),
        _cost(pod.metadata.annotations, migration.ANNOTATION_EVICTION_COST),
        (1, 0.0) if usage_score is None else (0, -usage_score),
        -_creation(pod),
    )


def sort_pods(
    pods: Sequence[SchedulingPod],
    pod_metrics: Mapping[str, Mapping[str, Fraction]],
    exceeding: Mapping[str, Fraction],
    weights: Mapping[str, int],
) -> list[SchedulingPod]:
    """sortPodsOnOneOverloadedNode: `exceeding` = usage − threshold of each over resource; only those resources
    weigh (with the pool's weights). Stable."""
    over_weights = {name: weights.get(name, 0) for name in exceeding}

    def key(pod: SchedulingPod) -> PodOrderKey:
        metric = pod_metrics.get(kube.pod_key(pod))
        score = None if metric is None else pod_usage_score(metric, exceeding, over_weights)
        return pod_order_key(pod, score)

    return sorted(pods, key=key)


def is_prod(pod: kube.Pod) -> bool:
    return kube.pod_priority_class(pod) == vocab.PRIORITY_PROD


def evictor_refusal(pod: kube.Pod) -> str | None:
    """Why the DefaultEvictor (default protections) refuses the pod, or None."""
    meta = pod.metadata
    annotations = meta.annotations
    if migration.ANNOTATION_EVICT in annotations:
        return None
    if MIRROR_ANNOTATION in annotations:
        return "mirror pod"
    if SOURCE_ANNOTATION in annotations and annotations[SOURCE_ANNOTATION] != "api":
        return "static pod"
    if meta.deletion_timestamp is not None:
        return "pod is terminating"
    if pod.spec.priority is not None and pod.spec.priority >= SYSTEM_CRITICAL_PRIORITY:
        return "system critical pod"
    if not meta.owner_references:
        return "pod has no owner (bare pod)"
    if any(v.host_path is not None or v.empty_dir is not None for v in pod.spec.volumes or ()):
        return "pod has local storage"
    if any(ref.kind == "DaemonSet" for ref in meta.owner_references):
        return "pod is owned by a DaemonSet"
    return None


def _available(node: kube.Node, node_pods: Sequence[kube.Pod], names: Iterable[str]) -> dict[str, int]:
    allocatable = kube.node_allocatable(node)
    requests = [kube.pod_request(p) for p in node_pods]

    def used(name: str) -> int:
        return sum(r.get(name, 0) for r in requests)

    available = {
        CPU: allocatable.get(CPU, 0) - used(CPU),
        MEMORY: allocatable.get(MEMORY, 0) - used(MEMORY),
        PODS: allocatable.get(PODS, 0) - len(node_pods),
    }
    for name in names:
        if name not in available:
            available[name] = allocatable[name] - used(name) if name in allocatable else 0
    return available


def node_fit(pod: SchedulingPod, node: SchedulingNode, node_pods: Sequence[kube.Pod]) -> bool:
    """NodeFit: node selector and required affinity, NoSchedule/NoExecute taints, requests ≤ allocatable − the
    requests of the node's pods, and a schedulable node."""
    if not pod_matches_node_labels(pod, node):
        return False
    if not tolerates_taints(pod.spec.tolerations or (), node.spec.taints or ()):
        return False
    request = kube.pod_request(pod)
    available = _available(node, node_pods, request)
    if any(amount > available[name] for name, amount in request.items()):
        return False
    return not node.spec.unschedulable


def pod_fits_any_node(
    pod: SchedulingPod,
    targets: Sequence[SchedulingNode],
    pods_on: Mapping[str, Sequence[kube.Pod]],
    usages: Mapping[str, MutableMapping[str, Fraction]],
    thresholds: Mapping[str, Mapping[str, Fraction]],
    metric: Mapping[str, Fraction],
) -> bool:
    """podFitsAnyNodeWithThreshold: the first target that passes NodeFit and stays within every threshold with the
    pod's metric added wins, and keeps the metric added; a target that would go over is left as it was."""
    for node in targets:
        name = node.metadata.name
        if not node_fit(pod, node, pods_on.get(name, ())):
            continue
        if name in usages and name in thresholds:
            usage = usages[name]
            added: list[str] = []
            exceeded = False
            for resource, threshold in thresholds[name].items():
                if resource in usage:
                    usage[resource] += metric.get(resource, Fraction(0))
                    added.append(resource)
                    if usage[resource] > threshold:
                        exceeded = True
                        break
            if exceeded:
                for resource in added:
                    usage[resource] -= metric.get(resource, Fraction(0))
                continue
        return True
    return False


def eviction_reason(
    prod: bool,
    high_percents: Mapping[str, float],
    prod_high_percents: Mapping[str, float],
    usage: Mapping[str, Fraction],
    thresholds: Mapping[str, Fraction],
    allocatable: Mapping[str, Fraction],
) -> str:
    """overUtilizedEvictionReason: one part per over resource among the keys of the node high percents (also in the
    prod pass), sorted by name. `usage` / `thresholds` are the prod ones in the prod pass."""
    over = set(over_resources(usage, thresholds))
    percents = prod_high_percents if prod else high_percents
    label = "prod" if prod else "node"
    used = usage_percentages(usage, allocatable)
    parts = [
        f"{label} {name} usage({used.get(name, 0.0):.2f}%)>threshold({float(percents.get(name, 0.0)):.2f}%)"
        for name in sorted(high_percents)
        if name in over
    ]
    return "node is overutilized, " + ", ".join(parts)
