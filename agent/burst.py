"""CPU burst (spec §5.6), computed. Pure.

Eligible pods: not labelled LSR, LSE or BE, and Pending or Running; a pod's `koordinator.sh/cpuBurst` annotation
(a CPUBurstConfig) is merged over the node's cpuBurstStrategy (`pod_config`).

* cfs burst (policy cpuBurstOnly or auto): each container with a CPU limit gets `cpu.cfs_burst_us` (v2
  `cpu.max.burst`) = limit cores × cpuBurstPercent % × 100000, the pod the sum (`cfs_burst_values`).
* cfs quota burst (policy cfsQuotaBurstOnly or auto): the shared pool's state (`pool_state`: overload, cooling,
  idle, unknown — from its use against sharePoolThresholdPercent) and each container's throttling decide whether its
  CFS quota scales up (×1.2), down (×0.8), stays, or resets to its base (`quota_target`), always within
  [base = limit × 100000, ceil = base × cfsQuotaBurstPercent %]. With cfsQuotaBurstPeriodSeconds ≥ 0 a token bucket
  per container (`TokenBucket`) stops a container that bursts for too long: usage over its limit spends tokens,
  usage under 60% earns them back, and no tokens means scale down.
"""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from agent.actuate import NodePod
from schemas import kube, quantity, vocab
from schemas.jsonmerge import overlay

POD_ANNOTATION: Final = "koordinator.sh/cpuBurst"
PERIOD_US: Final = 100000
MIN_BASE_QUOTA_US: Final = 1000
SCALE_UP: Final = 1.2
SCALE_DOWN: Final = 0.8
COOLING_RATIO: Final = 0.9

PoolState = Literal["overload", "cooling", "idle", "unknown"]
Decision = Literal["scaleUp", "scaleDown", "remain", "reset"]


def eligible(node_pod: NodePod) -> bool:
    label = node_pod.pod.metadata.labels.get(vocab.QOS_CLASS_LABEL)
    return label not in (vocab.QOS_LSR, vocab.QOS_LSE, vocab.QOS_BE) and node_pod.pod.status.phase in (
        "Pending",
        "Running",
    )


def pod_config(node_config: Mapping[str, Any], node_pod: NodePod) -> dict[str, Any]:
    """The node's cpuBurstStrategy with the pod's annotation merged over it (an unreadable annotation is ignored)."""
    merged = dict(node_config)
    text = node_pod.pod.metadata.annotations.get(POD_ANNOTATION)
    if text:
        try:
            override = json.loads(text)
        except ValueError:
            return merged
        if isinstance(override, dict):
            merged = overlay(merged, override)
    return merged


def cpu_limit_milli(container: kube.Container) -> int:
    limits = container.resources.limits or {}
    return quantity.amount("cpu", limits["cpu"]) if "cpu" in limits else 0


def cfs_burst_values(node_pod: NodePod, config: Mapping[str, Any]) -> tuple[int, dict[str, int]]:
    """(pod value, container name → value) of cfs burst, in µs."""
    percent = config.get("cpuBurstPercent", 1000)
    out: dict[str, int] = {}
    for container in node_pod.pod.spec.containers or ():
        limit = cpu_limit_milli(container)
        out[container.name] = int(limit * percent * PERIOD_US // (1000 * 100)) if limit > 0 else 0
    return sum(out.values()), out


def pool_state(total_cores: float, used_cores: float | None, threshold_percent: float) -> PoolState:
    if used_cores is None:
        return "unknown"
    ratio = used_cores / total_cores if total_cores > 0 else 1.0
    threshold = threshold_percent / 100
    if ratio >= threshold:
        return "overload"
    if ratio >= COOLING_RATIO * threshold:
        return "cooling"
    return "idle"


def quota_bounds(limit_milli: int, burst_percent: float) -> tuple[int, int]:
    base = max(limit_milli * PERIOD_US // 1000, MIN_BASE_QUOTA_US)
    ceil = int(base * burst_percent / 100) if burst_percent > 100 else base
    return base, ceil


def decide(*, quota_burst_on: bool, limiter_allows: bool, throttled_ratio: float | None, state: PoolState) -> Decision:
    if not quota_burst_on:
        return "reset"
    if not limiter_allows:
        decision: Decision = "scaleDown"
    elif throttled_ratio is not None and throttled_ratio > 0:
        decision = "scaleUp"
    else:
        decision = "remain"
    if state == "overload" and decision in ("scaleUp", "remain"):
        return "scaleDown"
    if state in ("cooling", "unknown") and decision == "scaleUp":
        return "remain"
    return decision


def quota_target(current: int, decision: Decision, base: int, ceil: int) -> int:
    if decision == "reset" or current <= 0:
        return base
    factor = {"scaleUp": SCALE_UP, "scaleDown": SCALE_DOWN, "remain": 1.0}[decision]
    return min(max(int(current * factor), base), ceil)


@dataclass
class TokenBucket:
    """Burst budget of one container: `capacity` = period × (burst% − 100) percent-seconds."""

    capacity: float
    tokens: float
    last_check: float
    last_used: float

    @classmethod
    def start(cls, *, period_seconds: float, burst_percent: float, now: float, seed: str) -> TokenBucket:
        capacity = period_seconds * (burst_percent - 100)
        initial = random.Random(seed).uniform(0, 0.5 * capacity) if capacity > 0 else 0.0
        return cls(capacity=capacity, tokens=initial, last_check=now, last_used=now)

    def allows(self, *, now: float, usage_percent: int) -> bool:
        """Account the usage since the last check (% of the limit), then whether a burst is allowed."""
        if self.capacity <= 0:
            return False
        seconds = int(now - self.last_check)
        if seconds > 0:
            if usage_percent >= 100:
                self.tokens -= (usage_percent - 100) * seconds
            elif usage_percent < 60:
                self.tokens += (100 - usage_percent) * seconds
            self.tokens = min(max(self.tokens, -self.capacity), self.capacity)
            self.last_check = now
        self.last_used = now
        return self.tokens > 0


def throttled_ratio(previous: tuple[int, int] | None, current: tuple[int, int]) -> float | None:
    """Δnr_throttled / Δnr_periods between two cpu.stat readings; None without a previous one or no periods."""
    if previous is None:
        return None
    periods = current[0] - previous[0]
    if periods <= 0:
        return None
    return max(current[1] - previous[1], 0) / periods


def usage_percent(used_cores: float, limit_milli: int) -> int:
    return int(used_cores * 1000 / limit_milli * 100) if limit_milli > 0 else 0
