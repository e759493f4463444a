"""Koordinator's JSON shapes for NodeMetric: the collect policy, Go durations, RFC 3339 times and the status.

Pure renderers and parsers between our msgspec types (schemas.node) and the camelCase objects Koordinator
users and koord-scheduler read (`slo.koordinator.sh/v1alpha1` NodeMetric, spec §1.2). Callers: the
nodemetric core (memory policy names), `koordbus calc nodemetric` (integer amounts), and the k8s writer and
the API (quantity strings, validated against the NodeMetric CRD in tests). Also the node annotations the
batch/mid calculation reads and writes (reservation, cpu-normalization ratio, third-party allocations,
originExtendedAllocatable; read by services.noderesource.core). Nothing here does I/O.
"""

from __future__ import annotations

import datetime as dt
import functools
import json
import math
import re
from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Final, Literal, TypeVar

import msgspec

from schemas import node, quantity, resources

API_VERSION: Final = "slo.koordinator.sh/v1alpha1"
KIND_NODEMETRIC: Final = "NodeMetric"

MEMORY_WITHOUT_PAGE_CACHE: Final = "usageWithoutPageCache"
MEMORY_WITH_HOT_PAGE_CACHE: Final = "usageWithHotPageCache"
MEMORY_WITH_PAGE_CACHE: Final = "usageWithPageCache"
_T = TypeVar("_T")
MemoryCollectPolicy = Literal["usageWithoutPageCache", "usageWithHotPageCache", "usageWithPageCache"]


class KoordinatorFormatError(ValueError):
    """A value msgspec accepted by type but Koordinator would not parse; `path` is a JSON path like `$.a[0]`."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def under(self, prefix: str) -> KoordinatorFormatError:
        """The same error with its path re-rooted below `prefix` (`$.spec` + `$.x` → `$.spec.x`)."""
        return KoordinatorFormatError(prefix + self.path[1:], self.reason)


# --- Go time.Duration text

_NANOS_PER_UNIT: Final = {
    "ns": 1,
    "us": 10**3,
    "µs": 10**3,  # U+00B5 micro sign, what Go prints
    "μs": 10**3,  # U+03BC Greek mu, which Go also accepts
    "ms": 10**6,
    "s": 10**9,
    "m": 60 * 10**9,
    "h": 3600 * 10**9,
}
_DURATION_TERM = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_NANOS_PER_SECOND: Final = 10**9


def parse_go_duration(text: str) -> Fraction:
    """Seconds in a Go duration string ("5m", "1h30m", "300s", "5m0s", "1.5h", "-2m"); "0" alone is zero."""
    sign, body = (-1, text[1:]) if text.startswith("-") else (1, text.removeprefix("+"))
    if body == "0":
        return Fraction(0)
    if not body:
        raise ValueError(f"invalid duration {text!r}")
    total, pos = Fraction(0), 0
    while pos < len(body):
        term = _DURATION_TERM.match(body, pos)
        if term is None:
            raise ValueError(f"invalid duration {text!r}")
        total += Fraction(term[1]) * _NANOS_PER_UNIT[term[2]]
        pos = term.end()
    return sign * total / _NANOS_PER_SECOND


def format_go_duration(seconds: int | float | Fraction) -> str:
    """Go's time.Duration.String(): 30 → "30s", 300 → "5m0s", 3600 → "1h0m0s", 0.5 → "500ms"."""
    nanos = round(Fraction(seconds) * _NANOS_PER_SECOND)
    sign, nanos = ("-", -nanos) if nanos < 0 else ("", nanos)
    if nanos == 0:
        return "0s"
    if nanos < _NANOS_PER_SECOND:
        for unit, size in (("ms", 10**6), ("µs", 10**3), ("ns", 1)):
            if nanos >= size:
                return sign + _decimal(nanos, size) + unit
    whole_seconds = nanos // _NANOS_PER_SECOND
    hours, minutes = whole_seconds // 3600, whole_seconds % 3600 // 60
    text = _decimal(nanos % (60 * _NANOS_PER_SECOND), _NANOS_PER_SECOND) + "s"
    if hours:
        return f"{sign}{hours}h{minutes}m{text}"
    if minutes:
        return f"{sign}{minutes}m{text}"
    return sign + text


def _decimal(value: int, unit: int) -> str:
    """`value / unit` written with only the fraction digits it needs (Go drops trailing zeros)."""
    whole, frac = divmod(value, unit)
    if not frac:
        return str(whole)
    width = len(str(unit)) - 1
    return f"{whole}.{frac:0{width}d}".rstrip("0")


# --- RFC 3339 times (metav1.Time: whole seconds, UTC)


def format_rfc3339(unix_seconds: float) -> str:
    """metav1.Time's JSON form: whole seconds (truncated), UTC, "Z" suffix."""
    moment = dt.datetime.fromtimestamp(int(unix_seconds), tz=dt.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_rfc3339(text: str) -> float:
    """Seconds since the epoch of an RFC 3339 time; a time without an offset is taken as UTC."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(f"invalid RFC 3339 time {text!r}") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    return moment.timestamp()


# --- spec.metricCollectPolicy


class NodeAggregatePolicyJSON(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    durations: list[str] | None = None


class MetricCollectPolicyJSON(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """`spec.metricCollectPolicy` as written in a NodeMetric; absent fields keep Koordinator's defaults."""

    aggregate_duration_seconds: int | None = None
    report_interval_seconds: int | None = None
    node_aggregate_policy: NodeAggregatePolicyJSON | None = None
    node_memory_collect_policy: MemoryCollectPolicy | None = None


def collect_policy_from_struct(raw: MetricCollectPolicyJSON) -> node.MetricCollectPolicy:
    """Overlay the fields that are present onto the defaults, as koordlet JSON-merges the CR spec (§1.3)."""
    base = node.MetricCollectPolicy()
    durations = base.durations_seconds
    if raw.node_aggregate_policy is not None and raw.node_aggregate_policy.durations is not None:
        durations = tuple(
            _whole_seconds(text, f"$.nodeAggregatePolicy.durations[{i}]")
            for i, text in enumerate(raw.node_aggregate_policy.durations)
        )
    return node.MetricCollectPolicy(
        aggregate_duration_seconds=_or(raw.aggregate_duration_seconds, base.aggregate_duration_seconds),
        report_interval_seconds=_or(raw.report_interval_seconds, base.report_interval_seconds),
        durations_seconds=durations,
        node_memory_collect_policy=_or(raw.node_memory_collect_policy, base.node_memory_collect_policy),
    )


def collect_policy_from_json(obj: Any) -> node.MetricCollectPolicy:
    """Parse a decoded `metricCollectPolicy` object; raises ValueError (msgspec's or ours) naming the field."""
    return collect_policy_from_struct(msgspec.convert(obj, MetricCollectPolicyJSON))


def collect_policy_to_json(policy: node.MetricCollectPolicy) -> dict[str, Any]:
    return {
        "aggregateDurationSeconds": policy.aggregate_duration_seconds,
        "reportIntervalSeconds": policy.report_interval_seconds,
        "nodeAggregatePolicy": {"durations": [format_go_duration(d) for d in policy.durations_seconds]},
        "nodeMemoryCollectPolicy": policy.node_memory_collect_policy,
    }


def _whole_seconds(text: str, path: str) -> int:
    try:
        seconds = parse_go_duration(text)
    except ValueError as err:
        raise KoordinatorFormatError(path, str(err)) from None
    if seconds.denominator != 1:
        raise KoordinatorFormatError(path, f"duration {text!r} is not a whole number of seconds")
    return int(seconds)


def _or(value: _T | None, default: _T) -> _T:
    return default if value is None else value


# --- status


def resource_map_to_json(rm: node.ResourceMap, *, quantities: bool) -> dict[str, Any]:
    """`{}` for "no data" (Koordinator omits `resources`), else `{"resources": {...}}`."""
    if not rm.resources:
        return {}
    if quantities:
        return {"resources": quantity.format_resource_list(rm.resources)}
    return {"resources": dict(rm.resources)}


def _aggregated_to_json(usages: list[node.AggregatedUsage], *, quantities: bool) -> list[dict[str, Any]]:
    return [
        {
            "usage": {kind: resource_map_to_json(rm, quantities=quantities) for kind, rm in usage.usage.items()},
            "duration": format_go_duration(usage.duration_seconds),
        }
        for usage in usages
    ]


def nodemetric_status_to_json(status: node.NodeMetricStatus, *, quantities: bool) -> dict[str, Any]:
    """NodeMetric `.status` in Koordinator's shape; amounts as quantity strings (API) or integers (calc).

    priority and qos are written even when empty, so a reader never has to tell "absent" from "None class".
    hostApplicationMetric is left out when there is none (Go's omitempty).
    """
    info = status.node_metric
    host_applications = {
        "hostApplicationMetric": [
            {
                "name": app.name,
                "usage": resource_map_to_json(app.usage, quantities=quantities),
                "priority": app.priority,
                "qos": app.qos,
            }
            for app in status.host_applications
        ]
    }
    predicted = {
        key: {"resource": resource_map_to_json(rm, quantities=quantities)}
        for key, rm in (("prodReclaimableMetric", status.prod_reclaimable), ("prodPeakMetric", status.prod_peak))
        if rm is not None
    }
    return {
        "updateTime": format_rfc3339(status.update_time),
        "nodeMetric": {
            "nodeUsage": resource_map_to_json(info.node_usage, quantities=quantities),
            "aggregatedNodeUsages": _aggregated_to_json(info.aggregated_node_usages, quantities=quantities),
            "systemUsage": resource_map_to_json(info.system_usage, quantities=quantities),
            "aggregatedSystemUsages": _aggregated_to_json(info.aggregated_system_usages, quantities=quantities),
            **(
                {
                    "numaUsages": [
                        {
                            "numaNodeID": numa.numa_node_id,
                            "nodeUsage": resource_map_to_json(numa.node_usage, quantities=quantities),
                            "systemUsage": resource_map_to_json(numa.system_usage, quantities=quantities),
                        }
                        for numa in info.numa_usages
                    ]
                }
                if info.numa_usages
                else {}
            ),
        },
        "podsMetric": [
            {
                "namespace": pod.namespace,
                "name": pod.name,
                "podUsage": resource_map_to_json(pod.pod_usage, quantities=quantities),
                "priority": pod.priority,
                "qos": pod.qos,
            }
            for pod in status.pods_metric
        ],
        **(host_applications if status.host_applications else {}),
        **predicted,
    }


def nodemetric_object(
    node_name: str, spec: node.MetricCollectPolicy, status: node.NodeMetricStatus | None
) -> dict[str, Any]:
    """The whole NodeMetric object as the API serves it (status omitted until the first report)."""
    obj: dict[str, Any] = {
        "apiVersion": API_VERSION,
        "kind": KIND_NODEMETRIC,
        "metadata": {"name": node_name},
        "spec": {"metricCollectPolicy": collect_policy_to_json(spec)},
    }
    if status is not None:
        obj["status"] = nodemetric_status_to_json(status, quantities=True)
    return obj


# --- node annotations read and written by the batch/mid calculation (spec §2.4–2.5)
#
# Koordinator logs and ignores an annotation it cannot read, so every reader returns None for "absent or
# unreadable" instead of raising; the JSON rules are Go's encoding/json (a wrong type fails the whole value).

ANNOTATION_NODE_RESERVATION: Final = "node.koordinator.sh/reservation"
ANNOTATION_CPU_NORMALIZATION_RATIO: Final = "node.koordinator.sh/cpu-normalization-ratio"
LABEL_CPU_NORMALIZATION_ENABLED: Final = "node.koordinator.sh/cpu-normalization-enabled"
ANNOTATION_CPU_BASIC_INFO: Final = "node.koordinator.sh/cpu-basic-info"
"""On the NodeResourceTopology: the node's CPU model, hyper-threading and turbo (what CPU normalization keys on)."""
ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE: Final = "node.koordinator.sh/originExtendedAllocatable"
ANNOTATION_THIRD_PARTY_ALLOCATIONS: Final = "node.koordinator.sh/thirdPartyAllocations"

_MAX_CPUSET_ID: Final = 4096  # Koordinator's cpuset parser rejects ranges ending above this
_CPU_ID: Final = re.compile(r"[+-]?\d+")
_GO_FLOAT: Final = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")


def _json_object(text: str) -> dict[str, Any] | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def _annotation_resources(raw: Any) -> resources.ResourceList | None:
    """A ResourceList inside an annotation's JSON (null is empty); None when it is not one."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        return None
    try:
        return quantity.resource_list({str(k): v for k, v in raw.items()})
    except quantity.QuantityError:
        return None


def count_cpuset(text: str) -> int | None:
    """How many CPUs a cpuset string ("0-3,8") names; None when Koordinator's parser rejects it."""
    cpus: set[int] = set()
    for part in text.split(","):
        bounds = part.split("-")
        if len(bounds) > 2 or not all(_CPU_ID.fullmatch(bound) for bound in bounds):
            return None
        numbers = [int(bound) for bound in bounds]
        if any(abs(number) >= 2**31 for number in numbers):
            return None
        if len(numbers) == 1:
            cpus.add(numbers[0])
            continue
        start, end = numbers
        if end > _MAX_CPUSET_ID:
            return None
        cpus.update(range(start, end + 1))  # start > end names nothing, as in Koordinator
    return len(cpus)


def node_reservation_resources(annotations: Mapping[str, str]) -> resources.ResourceList | None:
    """The resources `node.koordinator.sh/reservation` reserves (`{"resources": {...}, "reservedCPUs": "0-3"}`):
    when `reservedCPUs` is set its CPU count replaces `resources.cpu`. `applyPolicy` does not matter here."""
    text = annotations.get(ANNOTATION_NODE_RESERVATION, "")
    reservation = _json_object(text) if text else None
    if reservation is None:
        return None
    reserved = _annotation_resources(reservation.get("resources"))
    cpus = reservation.get("reservedCPUs") or ""
    if reserved is None or not isinstance(cpus, str):
        return None
    if cpus:
        count = count_cpuset(cpus)
        if count is None:
            return None
        reserved[resources.CPU] = count * 1000
    return reserved


def parse_cpu_normalization_ratio(text: str | None) -> float | None:
    """The cpu-normalization-ratio annotation value as Go's ParseFloat reads it; None when absent or invalid."""
    if text is None or not _GO_FLOAT.fullmatch(text):
        return None
    ratio = float(text)
    return ratio if math.isfinite(ratio) else None


def third_party_allocated(annotations: Mapping[str, str], priority_class: str) -> resources.ResourceList | None:
    """Σ resources of the `node.koordinator.sh/thirdPartyAllocations` entries (`{"allocations": [{"name",
    "priority", "resources"}]}`) of one priority class; None when the annotation is absent or unreadable."""
    text = annotations.get(ANNOTATION_THIRD_PARTY_ALLOCATIONS)
    document = None if text is None else _json_object(text)
    allocations = None if document is None else document.get("allocations") or []
    if not isinstance(allocations, list):
        return None
    total: resources.ResourceList = {}
    for entry in allocations:
        if not isinstance(entry, dict) or not all(isinstance(entry.get(k, ""), str) for k in ("name", "priority")):
            return None
        amounts = _annotation_resources(entry.get("resources"))
        if amounts is None:
            return None
        if entry.get("priority") == priority_class:
            total = resources.add(total, amounts)
    return total


@functools.lru_cache(maxsize=1024)
def _origin_entries(text: str) -> tuple[tuple[str, str], ...]:
    """The readable entries of an originExtendedAllocatable value, canonical (every decision re-reads the node's
    annotation, which rarely changes: cached by its text)."""
    existing = _json_object(text) or {}
    entries = existing.get("resources") or {}
    if not isinstance(entries, dict):
        return ()
    try:
        return tuple((str(k), quantity.canonicalize(v)) for k, v in entries.items())
    except quantity.QuantityError:
        return ()


def origin_extended_allocatable(annotations: Mapping[str, str], amounts: Mapping[str, int]) -> str:
    """The `node.koordinator.sh/originExtendedAllocatable` value after recording `amounts` (negative → 0): the
    annotation's readable entries kept, re-written canonically; keys sorted and compact, as Go marshals it."""
    merged = dict(_origin_entries(annotations.get(ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE, "")))
    for name, amount in amounts.items():
        merged[name] = quantity.format_amount(name, max(amount, 0))
    return json.dumps({"resources": dict(sorted(merged.items()))}, separators=(",", ":"))
