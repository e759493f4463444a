"""One watermark model for placement, descheduling and node QoS (issue 9 point 4, user-asks #8). Pure.

Koordinator keeps three unrelated sets of load thresholds: the scheduler's LoadAwareSchedulingArgs (memory 95%),
the descheduler's LowNodeLoad args, and the node agent's resource-threshold-config (BE memory eviction at 70%). A
pod evicted at 70% is then scheduled straight back by a filter that admits up to 95%, and evicted again.

koordbus reads them from one place, the `slo-controller-config` ConfigMap that node QoS already reads:

* our key `load-watermarks-config` (Koordinator ignores keys it does not know) holds the high watermark
  `usageThresholds` — the scheduler filters above it, the descheduler drains nodes above it, so the two cannot
  disagree — its prod variant, the descheduler's `lowThresholds` (where moved pods may go), and the one staleness
  rule both use (`nodeMetricExpirationSeconds`, `enableScheduleWhenNodeMetricsExpired`). A field left out keeps the
  value of the service's own args (Koordinator's names, from a file or the Helm values); when the key is absent
  the services run on their args alone, and `GET /api/v1/config/watermarks` says so.
* node QoS's `resource-threshold-config` (per node: cluster strategy or the first matching node strategy) is read
  as it is. With `avoidEvictionLoops` (default true) the scheduler caps its threshold, for a pod the node's agent
  could evict for that resource, one point under the agent's eviction threshold: `memoryEvictThresholdPercent`
  for BE pods (BEMemoryEvict) and for pods MemoryEvict may pick (label `koordinator.sh/eviction-enabled: "true"`
  and priority ≤ `evictEnabledPriorityThreshold`), `cpuEvictThresholdPercent` for pods CPUEvict may pick. The
  filter rejects a usage above its threshold and the agent evicts at or above its own (spec §6.5, §5.5.2–3), so a
  cap of threshold − 1 is the highest that keeps a placed pod out of eviction. A deliberate difference from
  Koordinator, which has no such link; `avoidEvictionLoops: false` turns it off.

`read_watermarks` parses our key (an error keeps the last good value, like every other key of the ConfigMap);
`eviction_caps` is the cap rule; `findings` lists the incoherences `GET /api/v1/config/watermarks` reports. Used by
services.loadaware, services.migration (descheduling) and services.api; the ConfigMap's keys are read with
services.common.sloconfig, as node QoS (services.slo) reads them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

from schemas import vocab
from schemas.qos import WatermarksInEffect
from services.common.sloconfig import (
    STRATEGY_KEYS,
    NodeStrategy,
    SloConfigError,
    StrategyConfig,
    first_match,
    parse_strategy,
)

WATERMARKS_KEY: Final = "load-watermarks-config"
THRESHOLD_KEY: Final = "resource-threshold-config"
EVICTION_ENABLED_LABEL: Final = "koordinator.sh/eviction-enabled"
_THRESHOLD_SLO_KEY: Final = next(key for key in STRATEGY_KEYS if key.config_key == THRESHOLD_KEY)


DeciderDefaults = Callable[["WatermarkConfig"], WatermarksInEffect]
"""What a decider (the load-aware extender, the descheduler) would state from the config alone, with its default args:
how the watermarks view shows one that has stated nothing yet (each service's component provides its own)."""


class WatermarksError(ValueError):
    """The key cannot be used; the message names the field (a JSON path)."""


class Watermarks(msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True):
    """The `load-watermarks-config` key. None: the field is not set here (the services' own args decide)."""

    usage_thresholds: dict[str, int] | None = None
    """Percent of allocatable: the scheduler admits up to it, the descheduler drains nodes above it."""
    prod_usage_thresholds: dict[str, int] | None = None
    """The scheduler's threshold for koord-prod pods on prod usage (Koordinator's prodUsageThresholds)."""
    low_thresholds: dict[str, int] | None = None
    """The descheduler moves pods only to nodes under these on every resource."""
    node_metric_expiration_seconds: int | None = None
    """A NodeMetric older than this is stale: the scheduler filters (or passes) the node and scores it 0, the
    descheduler leaves it out."""
    enable_schedule_when_node_metrics_expired: bool | None = None
    avoid_eviction_loops: bool = True


ABSENT: Final = Watermarks()


def fields_set(marks: Watermarks) -> list[str]:
    """The key's fields that are set (their JSON names), for saying where a value in effect comes from."""
    encoded = msgspec.to_builtins(marks)
    return sorted(name for name, value in encoded.items() if value is not None and name != "avoidEvictionLoops")


"""The key not in the ConfigMap: the services' args decide, caps on."""


def parse_watermarks(text: str | None) -> Watermarks:
    """Our key's JSON; None or "" is ABSENT."""
    if not text or not text.strip():
        return ABSENT
    try:
        decoded = msgspec.json.decode(text)
    except msgspec.DecodeError as err:
        raise WatermarksError(f"$: not JSON: {err}") from None
    if decoded is None:
        return ABSENT
    try:
        watermarks = msgspec.convert(decoded, Watermarks)
    except msgspec.ValidationError as err:
        raise WatermarksError(str(err)) from None
    for field, mapping in (
        ("usageThresholds", watermarks.usage_thresholds),
        ("prodUsageThresholds", watermarks.prod_usage_thresholds),
        ("lowThresholds", watermarks.low_thresholds),
    ):
        for name, value in (mapping or {}).items():
            if not 0 <= value <= 100:
                raise WatermarksError(f"$.{field}.{name}: {value} is outside 0..100")
    for name, low in (watermarks.low_thresholds or {}).items():
        high = (watermarks.usage_thresholds or {}).get(name)
        if high and low >= high:
            raise WatermarksError(f"$.lowThresholds.{name}: {low} is not under usageThresholds.{name} ({high})")
    if watermarks.node_metric_expiration_seconds is not None and watermarks.node_metric_expiration_seconds <= 0:
        raise WatermarksError("$.nodeMetricExpirationSeconds: must be positive")
    return watermarks


class WatermarkConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What a service reads of the ConfigMap for load decisions: our key and node QoS's thresholds."""

    watermarks: Watermarks = ABSENT
    thresholds: StrategyConfig = msgspec.field(
        default_factory=lambda: StrategyConfig(cluster=dict(_THRESHOLD_SLO_KEY.default))
    )
    errors: Mapping[str, str] = msgspec.field(default_factory=dict)
    """Key → why its last good value (or the default) is in use."""

    def strategies(self) -> tuple[Mapping[str, Any], ...]:
        """The cluster strategy, then each node strategy: the index `strategy_index` gives a node."""
        return (self.thresholds.cluster, *(node.strategy for node in self.thresholds.nodes))


def read_watermarks(data: Mapping[str, str] | None, previous: WatermarkConfig | None = None) -> WatermarkConfig:
    """The ConfigMap's data (None: no ConfigMap, the defaults); a key in error keeps its value from `previous`."""
    base = previous or WatermarkConfig()
    data = data or {}
    errors: dict[str, str] = {}
    try:
        watermarks = parse_watermarks(data.get(WATERMARKS_KEY))
    except WatermarksError as err:
        errors[WATERMARKS_KEY] = str(err)
        watermarks = base.watermarks
    try:
        thresholds = parse_strategy(_THRESHOLD_SLO_KEY, data.get(THRESHOLD_KEY))
    except SloConfigError as err:
        errors[THRESHOLD_KEY] = str(err)
        thresholds = base.thresholds
    return WatermarkConfig(watermarks=watermarks, thresholds=thresholds, errors=errors)


def strategy_index(nodes: Sequence[NodeStrategy], labels: Mapping[str, str]) -> int:
    """0 for the cluster strategy, i + 1 for the first node strategy whose selector matches (as render_node_slo)."""
    index = first_match([node.node_selector for node in nodes], labels)
    return 0 if index is None else index + 1


class EvictionFacts(msgspec.Struct, frozen=True, kw_only=True):
    """What the node agent's eviction looks at in a pod."""

    best_effort: bool
    """Koordinator QoS label BE."""
    eviction_enabled: bool
    priority: int
    """spec.priority (0 when unset), as the agent compares it."""


def eviction_facts(labels: Mapping[str, str], priority: int | None) -> EvictionFacts:
    return EvictionFacts(
        best_effort=labels.get(vocab.QOS_CLASS_LABEL) == vocab.QOS_BE,
        eviction_enabled=labels.get(EVICTION_ENABLED_LABEL) == "true",
        priority=priority or 0,
    )


def eviction_caps(strategy: Mapping[str, Any], pod: EvictionFacts) -> dict[str, int]:
    """Resource → the highest usage percent the scheduler may admit this pod to on a node with this
    resource-threshold strategy (nothing when the node's agent would not evict it for load)."""
    if not strategy.get("enable"):
        return {}
    caps: dict[str, int] = {}
    priority_limit = strategy.get("evictEnabledPriorityThreshold")
    picked_by_priority = pod.eviction_enabled and priority_limit is not None and pod.priority <= priority_limit
    memory = strategy.get("memoryEvictThresholdPercent")
    if memory and memory > 1 and (pod.best_effort or picked_by_priority):
        caps["memory"] = memory - 1
    cpu = strategy.get("cpuEvictThresholdPercent")
    if cpu and cpu > 1 and picked_by_priority:
        caps["cpu"] = cpu - 1
    return caps


def capped(thresholds: Mapping[str, int], caps: Mapping[str, int]) -> dict[str, int]:
    """Each threshold lowered to its cap; a resource the thresholds do not check (0 or absent) gets the cap."""
    out = dict(thresholds)
    for name, cap in caps.items():
        current = out.get(name, 0)
        out[name] = cap if current == 0 else min(current, cap)
    return out


class Finding(msgspec.Struct, frozen=True, kw_only=True):
    severity: str
    """"warning": pods will cycle; "info": a loop koordbus prevents, or something to know."""
    code: str
    message: str


def findings(
    *,
    schedule: Mapping[str, int],
    deschedule_high: Mapping[str, float] | None,
    scheduler_stale_seconds: float,
    descheduler_stale_seconds: float | None,
    strategies: Sequence[tuple[str, Mapping[str, Any]]],
    avoid_eviction_loops: bool,
) -> list[Finding]:
    """The incoherences between the scheduler's thresholds, the descheduler's (None: descheduling is not part of
    the picture) and each named node QoS strategy."""
    out: list[Finding] = []
    for name, high in sorted((deschedule_high or {}).items()):
        admit = schedule.get(name, 0)
        if admit == 0 or admit > high:
            shown = "without a limit" if admit == 0 else f"up to {admit}%"
            out.append(
                Finding(
                    severity="warning",
                    code="deschedule-reschedule-loop",
                    message=f"{name}: the scheduler places pods {shown} but the descheduler drains nodes above "
                    f"{high:g}%: a moved pod can be placed back on a node it will be moved from again",
                )
            )
    if descheduler_stale_seconds is not None and descheduler_stale_seconds != scheduler_stale_seconds:
        out.append(
            Finding(
                severity="warning",
                code="staleness-mismatch",
                message=f"the scheduler treats a NodeMetric older than {scheduler_stale_seconds:g} s as stale, the "
                f"descheduler one older than {descheduler_stale_seconds:g} s",
            )
        )
    for label, strategy in strategies:
        if not strategy.get("enable"):
            continue
        limit = strategy.get("evictEnabledPriorityThreshold")
        enabled_pods = f"eviction-enabled pods of priority ≤ {limit}"
        for resource, field, who in (
            (
                "memory",
                "memoryEvictThresholdPercent",
                "BE pods" + (f" and {enabled_pods}" if limit is not None else ""),
            ),
            ("cpu", "cpuEvictThresholdPercent", enabled_pods),
        ):
            evict = strategy.get(field)
            if not evict or (resource == "cpu" and limit is None):
                continue
            admit = schedule.get(resource, 0)
            if admit != 0 and admit < evict:
                continue
            shown = "without a limit" if admit == 0 else f"up to {admit}%"
            if avoid_eviction_loops:
                out.append(
                    Finding(
                        severity="info",
                        code="eviction-cap",
                        message=f"{label}: node QoS evicts {who} at {resource} {evict}%; the scheduler would admit "
                        f"them {shown}, so it caps them at {evict - 1}% (avoidEvictionLoops)",
                    )
                )
            else:
                out.append(
                    Finding(
                        severity="warning",
                        code="evict-reschedule-loop",
                        message=f"{label}: node QoS evicts {who} at {resource} {evict}% but the scheduler admits "
                        f"them {shown}: an evicted pod can be scheduled straight back (avoidEvictionLoops is off)",
                    )
                )
    return out
