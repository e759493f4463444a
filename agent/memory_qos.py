"""Memory QoS per container (issue 23, point 1; spec §5.3 "Memory QoS"), computed. Pure.

A container of a pod whose class (QoS with default: LSE and LSR → lsrClass, LS → lsClass, BE → beClass, SYSTEM →
systemClass) enables memoryQOS gets, from its memory request and limit (batch-memory for BE pods; the node's memory
where the limit is unset):
* memory.min  = request × minLimitPercent / 100
* memory.low  = request × lowLimitPercent / 100, at least memory.min
* memory.high = "max" when throttlingPercent is 0, else (request + (limit − request) × throttlingPercent / 100) rounded
  down to a page, at least memory.min.
A class with memoryQOS off gets the "none" values (0, 0, max: agent.slo puts them in its config), so turning it off
gives the memory back. The Anolis-kernel knobs (wmarkRatio, wmarkScalePermill, wmarkMinAdj, priority, oomKillGroup)
are not written: no mainline kernel has their files.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from schemas import vocab

PAGE_SIZE: Final = 4096
FILES: Final = ("memory.min", "memory.low", "memory.high")
CLASS_OF_QOS: Final[Mapping[str, str]] = {
    vocab.QOS_LSE: "lsrClass",
    vocab.QOS_LSR: "lsrClass",
    vocab.QOS_LS: "lsClass",
    vocab.QOS_BE: "beClass",
    vocab.QOS_SYSTEM: "systemClass",
}


def _percent(config: Mapping[str, Any], name: str) -> int:
    value = config.get(name) or 0
    return int(value) if isinstance(value, int | float) and not isinstance(value, bool) else 0


def container_values(request: int, limit: int | None, config: Mapping[str, Any], *, node_memory: int) -> dict[str, str]:
    """memory.min / memory.low / memory.high (bytes, or "max") for one container."""
    request = max(request, 0)
    upper = limit if limit is not None and limit > 0 else node_memory
    minimum = request * _percent(config, "minLimitPercent") // 100
    low = max(request * _percent(config, "lowLimitPercent") // 100, minimum)
    throttling = _percent(config, "throttlingPercent")
    if throttling == 0 or upper <= 0:  # no limit and the node's memory unknown: nothing to throttle against
        high = "max"
    else:
        bytes_high = (request + (upper - request) * throttling // 100) // PAGE_SIZE * PAGE_SIZE
        high = str(max(bytes_high, minimum))
    return {"memory.min": str(minimum), "memory.low": str(low), "memory.high": high}


def enabled_anywhere(strategy: Mapping[str, Any]) -> bool:
    """Whether any class turns memoryQOS on (else the loop writes nothing at all)."""
    return any(
        isinstance(strategy.get(name), Mapping) and strategy[name].get("memoryQOS", {}).get("enable")
        for name in set(CLASS_OF_QOS.values())
    )
