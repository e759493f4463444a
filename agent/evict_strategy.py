"""koordlet's eviction strategy as the NodeSLO writes it (spec §5.5: `spec.resourceUsedThresholdWithBE`), the config
checks each eviction feature makes before it runs, and the node-level release formulas that need no pod: the usage
trigger (BEMemoryEvict, MemoryEvict, CPUEvict) and BE CPU satisfaction (BECPUEvict). Pure.

Read literally, as koordlet's eviction code reads it: no default is merged (an absent memoryEvictThresholdPercent is
absent, not 70). The checks answer Koordinator's reason for refusing a config, or None. Integer steps follow Go
(division truncates toward zero), float steps are IEEE doubles truncated at the end. agent.evict_round builds the
round's tasks on these; koordbus.calc_evict reports them; the agent's own BE CPU loop (agent.evict) judges BE
busyness and satisfaction with the same two functions.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Final

import msgspec

from schemas import vocab

PRIORITY_MID_VALUE_MAX: Final = 7999
"""allocatableEvictPriorityThreshold may not reach prod priorities (Koordinator's PriorityMidValueMax)."""
RELEASE_BUFFER_PERCENT: Final = 2
"""The lower percent when none is configured: threshold − 2."""
DEFAULT_BE_USAGE_THRESHOLD_PERCENT: Final = 90
SATISFACTION_LOWER_MAX: Final = 60
SATISFACTION_UPPER_MAX: Final = 100
EVICT_BY_ALLOCATABLE: Final = "evictByAllocatable"

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
Int32 = Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)]


class ThresholdStrategy(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """NodeSLO `spec.resourceUsedThresholdWithBE` as written: nothing is defaulted (None = absent)."""

    enable: bool | None = None
    memory_evict_threshold_percent: Int64 | None = None
    memory_evict_lower_percent: Int64 | None = None
    memory_allocatable_evict_threshold_percent: Int64 | None = None
    memory_allocatable_evict_lower_percent: Int64 | None = None
    cpu_evict_be_satisfaction_upper_percent: Int64 | None = msgspec.field(
        default=None, name="cpuEvictBESatisfactionUpperPercent"
    )
    cpu_evict_be_satisfaction_lower_percent: Int64 | None = msgspec.field(
        default=None, name="cpuEvictBESatisfactionLowerPercent"
    )
    cpu_evict_be_usage_threshold_percent: Int64 | None = msgspec.field(
        default=None, name="cpuEvictBEUsageThresholdPercent"
    )
    cpu_evict_time_window_seconds: Int64 | None = None
    cpu_evict_threshold_percent: Int64 | None = None
    cpu_evict_lower_percent: Int64 | None = None
    cpu_allocatable_evict_threshold_percent: Int64 | None = None
    cpu_allocatable_evict_lower_percent: Int64 | None = None
    cpu_evict_policy: str | None = None
    evict_enabled_priority_threshold: Int32 | None = None
    allocatable_evict_priority_threshold: Int32 | None = None


class NodeSLO(msgspec.Struct, frozen=True, kw_only=True):
    """A NodeSLO spec; only the eviction strategy is read."""

    resource_used_threshold_with_be: ThresholdStrategy | None = msgspec.field(
        default=None, name="resourceUsedThresholdWithBE"
    )


def go_div(a: int, b: int) -> int:
    """Go's integer division: truncated toward zero."""
    q = abs(a) // abs(b)
    return q if (a >= 0) == (b >= 0) else -q


# --- the usage trigger


@dataclass(frozen=True, kw_only=True)
class UsageRelease:
    percent: int
    """int(used) × 100 / capacity, integer division."""
    lower: int
    triggered: bool
    """percent ≥ threshold."""
    release: int
    """capacity × (percent − lower) / 100 when triggered, else 0."""


def usage_release(*, capacity: int, used: float, threshold: int, lower: int | None) -> UsageRelease:
    """The node-usage trigger of BEMemoryEvict / MemoryEvict / CPUEvict (capacity > 0)."""
    percent = go_div(int(used) * 100, capacity)
    low = lower if lower is not None else threshold - RELEASE_BUFFER_PERCENT
    triggered = percent >= threshold
    amount = go_div(capacity * (percent - low), 100) if triggered else 0
    return UsageRelease(percent=percent, lower=low, triggered=triggered, release=amount)


# --- config checks


def feature_error(slo: NodeSLO | None) -> str | None:
    """Why the NodeSLO cannot say whether the features are on (koordlet's IsFeatureDisabled error), if it cannot."""
    if slo is None:
        return "cannot parse feature config for invalid nodeSLO: nodeSLO is null"
    strategy = slo.resource_used_threshold_with_be
    if strategy is None:
        return "cannot parse feature config for invalid nodeSLO: resourceUsedThresholdWithBE is not set"
    if strategy.enable is None:
        return "cannot parse feature config for invalid nodeSLO: resourceUsedThresholdWithBE.enable is not set"
    return None


def _check_usage(threshold: int | None, lower: int | None, *, name: str) -> str | None:
    """The usage trigger's config: threshold set and ≥ 0, lower (default threshold − 2) < threshold."""
    if threshold is None:
        return f"{name} not config"
    if threshold < 0:
        return f"{name}({threshold}) should equal or greater than 0"
    low = lower if lower is not None else threshold - RELEASE_BUFFER_PERCENT
    if low >= threshold:
        return f"lower percent({low}) should less than threshold percent({threshold})"
    return None


def _check_allocatable(
    threshold: int | None, lower: int | None, priority_threshold: int | None, *, prefix: str
) -> str | None:
    """The allocatable trigger's config: threshold set and ≥ 0, lower set and < it, allocatableEvictPriorityThreshold
    set and ≤ 7999 (prod pods are never evicted for allocatable)."""
    if threshold is None:
        return f"{prefix}AllocatableEvictThresholdPercent not config"
    if threshold < 0:
        return f"{prefix}AllocatableEvictThresholdPercent({threshold}) should equal or greater than 0"
    if lower is None:
        return f"{prefix}AllocatableEvictLowerPercent not config"
    if lower >= threshold:
        return f"lower percent({lower}) should less than threshold percent({threshold})"
    if priority_threshold is None:
        return "AllocatableEvictPriorityThreshold not config"
    if priority_threshold > PRIORITY_MID_VALUE_MAX:
        return (
            f"AllocatableEvictPriorityThreshold({priority_threshold}) should not be more than "
            f"{PRIORITY_MID_VALUE_MAX}, koord-prod pods should not be evicted"
        )
    return None


def check_be_memory(s: ThresholdStrategy) -> str | None:
    """BEMemoryEvict."""
    return _check_usage(
        s.memory_evict_threshold_percent, s.memory_evict_lower_percent, name="MemoryEvictThresholdPercent"
    )


def check_memory(s: ThresholdStrategy) -> str | None:
    """MemoryEvict: as BEMemoryEvict, and evictEnabledPriorityThreshold set."""
    problem = check_be_memory(s)
    if problem is None and s.evict_enabled_priority_threshold is None:
        return "EvictEnabledPriorityThreshold not config"
    return problem


def check_memory_allocatable(s: ThresholdStrategy) -> str | None:
    """MemoryAllocatableEvict."""
    return _check_allocatable(
        s.memory_allocatable_evict_threshold_percent,
        s.memory_allocatable_evict_lower_percent,
        s.allocatable_evict_priority_threshold,
        prefix="Memory",
    )


def check_cpu(s: ThresholdStrategy) -> str | None:
    """CPUEvict: the usage trigger's config and evictEnabledPriorityThreshold set."""
    problem = _check_usage(s.cpu_evict_threshold_percent, s.cpu_evict_lower_percent, name="CPUEvictThresholdPercent")
    if problem is None and s.evict_enabled_priority_threshold is None:
        return "EvictEnabledPriorityThreshold not config"
    return problem


def check_cpu_allocatable(s: ThresholdStrategy) -> str | None:
    """CPUAllocatableEvict."""
    return _check_allocatable(
        s.cpu_allocatable_evict_threshold_percent,
        s.cpu_allocatable_evict_lower_percent,
        s.allocatable_evict_priority_threshold,
        prefix="CPU",
    )


def check_be_cpu(s: ThresholdStrategy) -> str | None:
    """BECPUEvict: both satisfaction percents set, 0 < lower ≤ 60, 0 < upper < 100, upper ≥ lower."""
    lower = s.cpu_evict_be_satisfaction_lower_percent
    upper = s.cpu_evict_be_satisfaction_upper_percent
    if lower is None or upper is None:
        return "CPUEvictBESatisfactionLowerPercent or CPUEvictBESatisfactionUpperPercent not config"
    if lower > SATISFACTION_LOWER_MAX or lower <= 0:
        return f"CPUEvictBESatisfactionLowerPercent({lower}) is not valid, must be in (0,{SATISFACTION_LOWER_MAX}]"
    if upper >= SATISFACTION_UPPER_MAX or upper <= 0:
        return f"CPUEvictBESatisfactionUpperPercent({upper}) is not valid, must be in (0,{SATISFACTION_UPPER_MAX})"
    if upper < lower:
        return f"CPUEvictBESatisfactionUpperPercent({upper}) < CPUEvictBESatisfactionLowerPercent({lower})"
    return None


# --- BE CPU satisfaction (BECPUEvict)


@dataclass(frozen=True, kw_only=True)
class BeCpu:
    """The BE group's CPU in millicores: usage, Σ batch-cpu request and real limit (window average or last sample)."""

    usage: float
    request: float
    limit: float


def be_allocatable_limit(allocatable: Mapping[str, int] | None) -> float:
    """The limit under cpuEvictPolicy evictByAllocatable: node allocatable batch-cpu; absent or negative → −1, 0 → 1
    (a batch allocatable cut to zero still lets satisfaction be judged)."""
    if allocatable is None or allocatable.get(vocab.BATCH_CPU, -1) < 0:
        return -1.0
    value = allocatable[vocab.BATCH_CPU]
    return 1.0 if value == 0 else float(value)


def be_usage_high(usage: float, limit: float, threshold_percent: float | None) -> bool:
    """BE uses enough of its limit to judge: limit ≤ 0 → no; under one core → yes; else usage/limit ≥ threshold%."""
    if limit <= 0:
        return False
    if limit < 1000:
        return True
    threshold = threshold_percent if threshold_percent is not None else DEFAULT_BE_USAGE_THRESHOLD_PERCENT
    return not usage / limit < float(threshold) / 100


def be_satisfaction_gap(request: float, limit: float, *, lower: float, upper: float) -> int:
    """Millicores to release so limit/request climbs back to upper%: 0 unless it fell to lower% or below."""
    if request <= 0:
        return 0
    satisfaction = limit / request
    if satisfaction > float(lower) / 100:
        return 0
    gap = float(upper) / 100 - satisfaction
    if gap <= 0:
        return 0
    return int(request * gap)


@dataclass(frozen=True, kw_only=True)
class Satisfaction:
    release: int
    """batch-cpu millicores BECPUEvict is to release (0: nothing)."""
    reason: str
    """The step that decided, with its numbers."""


def be_satisfaction_release(
    strategy: ThresholdStrategy, *, window: BeCpu, count: int, current: BeCpu, interval: int, allocatable: float
) -> Satisfaction:
    """BECPUEvict's release from the window averages over `count` samples and the last sample; 0 without both
    satisfaction percents. The limit is the BE real limit, or the node's batch allocatable under evictByAllocatable."""
    lower = strategy.cpu_evict_be_satisfaction_lower_percent
    upper = strategy.cpu_evict_be_satisfaction_upper_percent
    if lower is None or upper is None:
        return Satisfaction(release=0, reason="needs cpuEvictBESatisfactionLowerPercent and UpperPercent")
    window_seconds = interval
    configured = strategy.cpu_evict_time_window_seconds
    if configured is not None and configured > window_seconds:
        window_seconds = configured
    if count * interval < go_div(window_seconds, 3):
        return Satisfaction(
            release=0, reason=f"{count} samples × {interval} s < a third of the {window_seconds} s window"
        )
    by_allocatable = strategy.cpu_evict_policy == EVICT_BY_ALLOCATABLE
    window_limit = allocatable if by_allocatable else window.limit
    current_limit = allocatable if by_allocatable else current.limit
    threshold = strategy.cpu_evict_be_usage_threshold_percent
    if not be_usage_high(window.usage, window_limit, threshold):
        return Satisfaction(
            release=0, reason=f"window: BE uses {window.usage:g} of its limit {window_limit:g}, not busy"
        )
    release = be_satisfaction_gap(window.request, window_limit, lower=lower, upper=upper)
    head = f"window: request {window.request:g} × ({upper}% − limit {window_limit:g} / request) = {release}"
    if release <= 0:
        return Satisfaction(release=0, reason=f"{head} (satisfied above {lower}%)")
    if not be_usage_high(current.usage, current_limit, threshold):
        return Satisfaction(release=0, reason=f"{head}; last: BE uses {current.usage:g} of {current_limit:g}, not busy")
    if current.request == window.request and current_limit == window_limit:
        return Satisfaction(release=release, reason=f"{head}; last sample: same request and limit")
    by_current = be_satisfaction_gap(current.request, current_limit, lower=lower, upper=upper)
    tail = f"last: request {current.request:g} × ({upper}% − limit {current_limit:g} / request) = {by_current}"
    if by_current <= 0:
        return Satisfaction(release=0, reason=f"{head}; {tail}")
    return Satisfaction(release=min(release, by_current), reason=f"{head}; {tail}; the lesser")
