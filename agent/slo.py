"""The agent's effective NodeSLO (spec §5.2): the rendered spec merged onto the agent's full defaults.

Pure. Each sub-strategy of the NodeSLO spec is overlaid (schemas.jsonmerge.overlay, Koordinator's MergeCfg) onto
the koordlet defaults; then in each QoS class a disabled cpuQOS / resctrlQOS / memoryQOS has its values replaced by
the "none" values, so a loop reading a disabled class can never apply stale numbers. A missing or null sub-strategy
means the defaults. `spec_problems` says why a spec cannot be acted on (a bad type or an out-of-range value in any
field a loop reads): the agent then keeps its previous spec whole. The table of defaults is spec §5.3 (classes),
§5.5 (threshold), §5.6 (burst) and Koordinator's DefaultSystemStrategy (system: minFreeKbytesFactor 100,
watermarkScaleFactor 150, memcgReapBackGround 0).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

from schemas.jsonmerge import overlay

QOS_CLASSES: Final = ("lsrClass", "lsClass", "beClass", "systemClass")


def _resource_qos(
    group_identity: int, core_expeller: bool, cat_end: int, wmark_ratio: int, scale: int, adj: int
) -> dict[str, Any]:
    return {
        "cpuQOS": {"enable": False, "groupIdentity": group_identity, "schedIdle": 0, "coreExpeller": core_expeller},
        "resctrlQOS": {"enable": False, "catRangeStartPercent": 0, "catRangeEndPercent": cat_end, "mbaPercent": 100},
        "memoryQOS": {
            "enable": False,
            "minLimitPercent": 0,
            "lowLimitPercent": 0,
            "throttlingPercent": 0,
            "wmarkRatio": wmark_ratio,
            "wmarkScalePermill": scale,
            "wmarkMinAdj": adj,
            "priorityEnable": 0,
            "priority": 0,
            "oomKillGroup": 0,
        },
    }


AGENT_DEFAULTS: Final[Mapping[str, Mapping[str, Any]]] = {
    "resourceUsedThresholdWithBE": {
        "enable": False,
        "cpuSuppressThresholdPercent": 65,
        "cpuSuppressPolicy": "cpuset",
        "memoryEvictThresholdPercent": 70,
        "cpuEvictPolicy": "evictByRealLimit",
    },
    "resourceQOSStrategy": {
        "policies": {"cpuPolicy": "groupIdentity", "netQOSPolicy": "tc"},
        "lsrClass": _resource_qos(2, True, 100, 95, 20, -25),
        "lsClass": _resource_qos(2, True, 100, 95, 20, -25),
        "beClass": _resource_qos(-1, False, 30, 95, 20, 50),
        "systemClass": _resource_qos(0, False, 100, 0, 50, 0),
    },
    "cpuBurstStrategy": {
        "policy": "none",
        "cpuBurstPercent": 1000,
        "cfsQuotaBurstPercent": 300,
        "cfsQuotaBurstPeriodSeconds": -1,
        "sharePoolThresholdPercent": 50,
    },
    "systemStrategy": {
        "minFreeKbytesFactor": 100,
        "watermarkScaleFactor": 150,
        "memcgReapBackGround": 0,
        "totalNetworkBandwidth": 0,
    },
}

DISABLED_VALUES: Final[Mapping[str, Mapping[str, Any]]] = {
    "cpuQOS": {"groupIdentity": 0, "schedIdle": 0, "coreExpeller": False},
    "resctrlQOS": {"catRangeStartPercent": 0, "catRangeEndPercent": 100, "mbaPercent": 100},
    "memoryQOS": {
        "minLimitPercent": 0,
        "lowLimitPercent": 0,
        "throttlingPercent": 0,
        "wmarkRatio": 0,
        "wmarkScalePermill": 50,
        "wmarkMinAdj": 0,
        "priorityEnable": 0,
        "priority": 0,
        "oomKillGroup": 0,
    },
}
"""What a disabled QoS section of a class holds after the merge (spec §5.2)."""


def effective_slo(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """The NodeSLO spec the agent acts on: `spec` (None before any arrives) merged onto the agent defaults."""
    spec = spec or {}
    merged: dict[str, Any] = {}
    for field, default in AGENT_DEFAULTS.items():
        given = spec.get(field)
        merged[field] = overlay(copy.deepcopy(dict(default)), given if isinstance(given, Mapping) else {})
    qos = merged["resourceQOSStrategy"]
    for name in QOS_CLASSES:
        qos_class = qos[name]
        for section, disabled in DISABLED_VALUES.items():
            if not qos_class[section].get("enable", False):
                qos_class[section] = {**qos_class[section], **disabled, "enable": False}
    merged["hostApplications"] = list(spec.get("hostApplications") or [])
    return merged


_Number = (int, float)
_PERCENT_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "resourceUsedThresholdWithBE": (
        "cpuSuppressThresholdPercent",
        "cpuSuppressMinPercent",
        "memoryEvictThresholdPercent",
        "memoryEvictLowerPercent",
        "cpuEvictBESatisfactionLowerPercent",
        "cpuEvictBESatisfactionUpperPercent",
        "cpuEvictBEUsageThresholdPercent",
        "cpuEvictThresholdPercent",
        "cpuEvictLowerPercent",
    ),
    "cpuBurstStrategy": ("sharePoolThresholdPercent",),
}
_CHOICES: Final[Mapping[tuple[str, str], frozenset[str]]] = {
    ("resourceUsedThresholdWithBE", "cpuSuppressPolicy"): frozenset({"cpuset", "cfsQuota"}),
    ("resourceUsedThresholdWithBE", "cpuEvictPolicy"): frozenset({"evictByRealLimit", "evictByAllocatable"}),
    ("cpuBurstStrategy", "policy"): frozenset({"none", "cpuBurstOnly", "cfsQuotaBurstOnly", "auto"}),
}


def _in_range(value: object, low: float, high: float) -> bool:
    return not isinstance(value, bool) and isinstance(value, _Number) and low <= value <= high


def spec_problems(spec: Mapping[str, Any] | None) -> list[str]:
    """Why the agent cannot act on this NodeSLO spec (empty: it can): every field a loop reads, merged onto the
    defaults, with its type and range. The slo service only renders valid specs; this guards against anything else
    that writes the bucket, so that a bad value is refused whole instead of crashing a loop or being written."""
    if spec is not None and not isinstance(spec, Mapping):
        return ["the spec is not an object"]
    try:
        merged = effective_slo(spec)
    except (TypeError, AttributeError, ValueError) as e:
        return [f"the spec does not merge onto the defaults: {e}"]
    problems: list[str] = []
    for section, fields in _PERCENT_FIELDS.items():
        for name in fields:
            value = merged[section].get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, _Number) or not 0 <= value <= 100
            ):
                problems.append(f"{section}.{name}: {value!r} is not a percent in [0, 100]")
    for (section, name), allowed in _CHOICES.items():
        value = merged[section].get(name)
        if value not in allowed:
            problems.append(f"{section}.{name}: {value!r} is not one of {', '.join(sorted(allowed))}")
    threshold = merged["resourceUsedThresholdWithBE"]
    if not isinstance(threshold.get("enable"), bool):
        problems.append("resourceUsedThresholdWithBE.enable is not a boolean")
    for name, low, high in (
        ("evictEnabledPriorityThreshold", -(2**31), 2**31 - 1),
        ("allocatableEvictPriorityThreshold", -(2**31), 2**31 - 1),
        ("cpuEvictTimeWindowSeconds", 0, 86400),
        ("memoryAllocatableEvictThresholdPercent", 0, 1000),
        ("memoryAllocatableEvictLowerPercent", 0, 1000),
        ("cpuAllocatableEvictThresholdPercent", 0, 1000),
        ("cpuAllocatableEvictLowerPercent", 0, 1000),
    ):
        value = threshold.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            problems.append(f"resourceUsedThresholdWithBE.{name}: {value!r} is not an integer in [{low}, {high}]")
    burst = merged["cpuBurstStrategy"]
    for name, low, high in (("cpuBurstPercent", 0, 10000), ("cfsQuotaBurstPercent", 0, 100000)):
        value = burst.get(name)
        if not _in_range(value, low, high):
            problems.append(f"cpuBurstStrategy.{name}: {value!r} is not in [{low}, {high}]")
    period = burst.get("cfsQuotaBurstPeriodSeconds")
    if isinstance(period, bool) or not isinstance(period, int) or period < -1:
        problems.append(f"cpuBurstStrategy.cfsQuotaBurstPeriodSeconds: {period!r} is not an integer ≥ -1")
    for qos_class in QOS_CLASSES:
        resctrl = merged["resourceQOSStrategy"].get(qos_class, {}).get("resctrlQOS", {})
        for name in ("catRangeStartPercent", "catRangeEndPercent", "mbaPercent"):
            value = resctrl.get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, _Number) or not 0 <= value <= 100
            ):
                problems.append(f"resourceQOSStrategy.{qos_class}.resctrlQOS.{name}: {value!r} is not in [0, 100]")
    return problems
