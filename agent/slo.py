"""The agent's effective NodeSLO (spec §5.2): the rendered spec merged onto the agent's full defaults.

Pure. Each sub-strategy of the NodeSLO spec is overlaid (services.slo.render.overlay, Koordinator's MergeCfg) onto
the koordlet defaults; then in each QoS class a disabled cpuQOS / resctrlQOS / memoryQOS has its values replaced by
the "none" values, so a loop reading a disabled class can never apply stale numbers. A missing or null sub-strategy
means the defaults. The table of defaults is spec §5.3 (classes), §5.5 (threshold), §5.6 (burst) and Koordinator's
DefaultSystemStrategy (system: minFreeKbytesFactor 100, watermarkScaleFactor 150, memcgReapBackGround 0).
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
