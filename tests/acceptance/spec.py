"""Koordinator's arithmetic as the acceptance suite recomputes it from what the API server holds: quantities, the
podsMetric by namespace/name, priority classes (spec §0), the batch resources of a node (spec §2.4) and their CPU
normalization (§2.5), the BE CFS quota of CPU suppress (spec §5.5.1) and of a normalized node (§5.7), memory QoS
(§5.3) and the load-aware percentages (§6.4, Go's rounding). Used by tests/acceptance/test_node_acceptance.py; the
code under test computes the same numbers its own way.
"""

from __future__ import annotations

import math
from typing import Any

from schemas.quantity import parse_quantity


def milli(quantity: str) -> int:
    return int(parse_quantity(quantity).value * 1000)


def to_bytes(quantity: str) -> int:
    return int(parse_quantity(quantity).value)


def entries(metric: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The NodeMetric's podsMetric by namespace/name."""
    return {f"{p.get('namespace', '')}/{p.get('name', '')}": p for p in metric["status"].get("podsMetric", [])}


def priority_class(pod: dict[str, Any]) -> str:
    """Spec §0: the label, else spec.priority by range."""
    label = pod["metadata"].get("labels", {}).get("koordinator.sh/priority-class")
    if label in ("koord-prod", "koord-mid", "koord-batch", "koord-free"):
        return str(label)
    value = pod["spec"].get("priority")
    for low, high, name in ((9000, 9999, "koord-prod"), (7000, 7999, "koord-mid"), (5000, 5999, "koord-batch")):
        if value is not None and low <= value <= high:
            return name
    return "koord-free" if value is not None and 3000 <= value <= 3999 else ""


def request(pod: dict[str, Any]) -> tuple[int, int]:
    """(cpu milli, memory bytes) the pod's containers request."""
    cpu = memory = 0
    for container in pod["spec"]["containers"]:
        requests = container.get("resources", {}).get("requests", {})
        cpu += milli(requests.get("cpu", "0"))
        memory += to_bytes(requests.get("memory", "0"))
    return cpu, memory


def spec_batch(node_obj: dict[str, Any], metric: dict[str, Any], pods: list[dict[str, Any]]) -> tuple[int, int, str]:
    """Spec §2.4 with the default reclaim thresholds (60 % CPU, 65 % memory) and the usage policy: (batch-cpu milli,
    batch-memory bytes, the formula with its numbers)."""
    capacity = node_obj["status"]["capacity"]
    allocatable = node_obj["status"]["allocatable"]
    cap = (milli(capacity["cpu"]), to_bytes(capacity["memory"]))
    margin = (cap[0] * 40 // 100, cap[1] * 35 // 100)
    reserved = (
        max(cap[0] - milli(allocatable["cpu"]), 0),
        max(cap[1] - to_bytes(allocatable["memory"]), 0),
    )
    system_usage = metric["status"]["nodeMetric"]["systemUsage"]["resources"]
    system = (milli(system_usage.get("cpu", "0")), to_bytes(system_usage.get("memory", "0")))
    metrics = entries(metric)
    used = [0, 0]
    seen: set[str] = set()
    for pod in pods:
        if pod["status"].get("phase") not in ("Running", "Pending"):
            continue
        key = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
        entry = metrics.get(key)
        if entry is not None:
            seen.add(key)
        if priority_class(pod) in ("koord-batch", "koord-free"):
            continue
        if entry is None:
            requested = request(pod)
            used = [used[0] + requested[0], used[1] + requested[1]]
        else:
            usage = entry["podUsage"]["resources"]
            used = [used[0] + milli(usage["cpu"]), used[1] + to_bytes(usage["memory"])]
    for key, entry in metrics.items():  # dangling: a metric without a pod
        if key not in seen and entry.get("priority") not in ("koord-batch", "koord-free"):
            usage = entry["podUsage"]["resources"]
            used = [used[0] + milli(usage["cpu"]), used[1] + to_bytes(usage["memory"])]
    out = [max(cap[i] - margin[i] - max(system[i], reserved[i]) - used[i], 0) for i in range(2)]
    formula = (
        f"cpu {out[0]} = capacity {cap[0]} - margin {margin[0]} - max(system {system[0]}, reserved {reserved[0]}) "
        f"- hp used {used[0]}; memory {out[1]} = {cap[1]} - {margin[1]} - max({system[1]}, {reserved[1]}) - {used[1]}"
    )
    return out[0], out[1], formula


QUOTA_PERIOD_US = 100_000
MIN_QUOTA_US = 2000


def spec_suppress(
    *, capacity_milli: int, threshold_percent: float, min_percent: float | None, non_be: int, system: int
) -> int:
    """Spec §5.5.1: the CPU BE pods may use, millicores, from the terms an agent states."""
    allowed = int(capacity_milli * threshold_percent / 100) - non_be - system
    if min_percent is not None:
        allowed = max(allowed, int(capacity_milli * min_percent / 100))
    return allowed


def spec_cfs_quota(allowed_milli: int, *, current: int, cpus: int) -> int | None:
    """Spec §5.5.1's cfsQuota policy: the besteffort cpu.cfs_quota_us to write when it holds `current` (-1:
    unlimited), or None when the move is skipped (under 1 % of the node's quota, unless it is the minimum)."""
    quota = max(allowed_milli * QUOTA_PERIOD_US // 1000, MIN_QUOTA_US)
    node_quota = cpus * QUOTA_PERIOD_US
    if current != -1:
        quota = min(quota, current + node_quota // 10)  # growth per round limited to 10 % of the node
        if abs(quota - current) < node_quota // 100 and quota != MIN_QUOTA_US:
            return None
    return quota


def go_percent(used: int, total: int) -> int:
    """Spec §6.4's `round(used / total × 100)` as Go computes it: `math.Round(float64(used) / float64(total) * 100)`,
    float64 in that order and halves rounded away from zero (Python's round() would round 230.5 to 230, Go to 231)."""
    x = float(used) / float(total) * 100
    whole = math.floor(x)
    return int(whole + 1 if x - whole >= 0.5 else whole)


def spec_normalized_batch_cpu(value: int, ratio: float) -> int:
    """Spec §2.5 steps 2–3: batch-cpu × the cpu-normalization-ratio with milli truncation (Go's
    `int64(float64(milli) * ratio)`), a fractional quantity rounded up; unchanged unless the ratio is above 1."""
    if ratio <= 1.0:
        return value
    milli = int(float(value * 1000) * ratio)
    return -(-milli // 1000)


def spec_normalized_quota(quota: int, ratio: float) -> int:
    """Spec §5.7: a BE CFS quota on a node whose cpu-normalization ratio r is above 1 is ceil(quota / r) (the
    ratios the suite uses are exact in binary, so the float division is exact)."""
    return math.ceil(quota / ratio) if quota > 0 and ratio > 1 else quota


PAGE_SIZE = 4096


def spec_memory_qos(request: int, limit: int | None, config: dict[str, int], *, node_memory: int) -> dict[str, str]:
    """Spec §5.3 memory QoS of one container: memory.min, memory.low (≥ min) and memory.high ("max" when
    throttlingPercent is 0, else a page-floored value between request and limit, ≥ min)."""
    minimum = request * config.get("minLimitPercent", 0) // 100
    low = max(request * config.get("lowLimitPercent", 0) // 100, minimum)
    throttling = config.get("throttlingPercent", 0)
    if throttling == 0:
        high = "max"
    else:
        upper = limit if limit else node_memory
        high = str(max((request + (upper - request) * throttling // 100) // PAGE_SIZE * PAGE_SIZE, minimum))
    return {"memory.min": str(minimum), "memory.low": str(low), "memory.high": high}
