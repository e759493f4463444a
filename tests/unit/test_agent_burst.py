"""agent.burst (spec §5.6): eligibility, the pod annotation override, cfs burst values, the shared pool's state,
scale decisions and targets within [base, ceil], the token bucket, throttling ratios."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from agent import burst
from agent.actuate import NodePod
from schemas import kube

UID = "3f1e2d3c-0000-4000-8000-000000000001"


def ls_pod(*, label: str = "LS", limits: tuple[str, ...] = ("2", "500m"), annotation: Any = None) -> NodePod:
    annotations = {burst.POD_ANNOTATION: json.dumps(annotation)} if annotation is not None else {}
    pod = msgspec.convert(
        {
            "metadata": {
                "name": "web",
                "namespace": "shop",
                "uid": UID,
                "labels": {"koordinator.sh/qosClass": label},
                "annotations": annotations,
            },
            "spec": {
                "containers": [{"name": f"c{i}", "resources": {"limits": {"cpu": cpu}}} for i, cpu in enumerate(limits)]
                + [{"name": "nolimit"}]
            },
            "status": {"phase": "Running", "qosClass": "Burstable"},
        },
        kube.Pod,
    )
    return NodePod(pod=pod, containers={})


def test_eligibility() -> None:
    assert burst.eligible(ls_pod())
    assert burst.eligible(ls_pod(label=""))
    assert not any(burst.eligible(ls_pod(label=label)) for label in ("LSR", "LSE", "BE"))


def test_cfs_burst_values_and_the_pod_override() -> None:
    node = {"policy": "auto", "cpuBurstPercent": 1000}
    total, per_container = burst.cfs_burst_values(ls_pod(), node)
    assert per_container == {"c0": 2_000_000, "c1": 500_000, "nolimit": 0}  # 2 cores × 1000% × 100000 µs
    assert total == 2_500_000
    pod = ls_pod(annotation={"cpuBurstPercent": 200})
    config = burst.pod_config(node, pod)
    assert config == {"policy": "auto", "cpuBurstPercent": 200}
    assert burst.cfs_burst_values(pod, config)[1]["c0"] == 400_000
    broken = ls_pod()
    broken_pod = msgspec.structs.replace(
        broken.pod,
        metadata=msgspec.structs.replace(broken.pod.metadata, annotations={burst.POD_ANNOTATION: "{nope"}),
    )
    assert burst.pod_config(node, NodePod(pod=broken_pod)) == node


@pytest.mark.parametrize(("used", "state"), [(None, "unknown"), (5.0, "overload"), (4.6, "cooling"), (4.4, "idle")])
def test_pool_state(used: float | None, state: str) -> None:
    assert burst.pool_state(10, used, 50) == state
    assert burst.pool_state(0, 1.0, 50) == "overload"  # no shared pool left


def test_decisions_and_targets() -> None:
    up = {"quota_burst_on": True, "limiter_allows": True, "throttled_ratio": 0.3}
    assert burst.decide(**up, state="idle") == "scaleUp"
    assert burst.decide(**up, state="cooling") == "remain"
    assert burst.decide(**up, state="unknown") == "remain"
    assert burst.decide(**up, state="overload") == "scaleDown"
    assert burst.decide(**{**up, "throttled_ratio": 0.0}, state="overload") == "scaleDown"
    assert burst.decide(**{**up, "limiter_allows": False}, state="idle") == "scaleDown"
    assert burst.decide(**{**up, "quota_burst_on": False}, state="idle") == "reset"
    base, ceil = burst.quota_bounds(2000, 300)
    assert (base, ceil) == (200_000, 600_000)
    assert burst.quota_target(200_000, "scaleUp", base, ceil) == 240_000
    assert burst.quota_target(580_000, "scaleUp", base, ceil) == 600_000
    assert burst.quota_target(210_000, "scaleDown", base, ceil) == 200_000
    assert burst.quota_target(450_000, "reset", base, ceil) == 200_000
    assert burst.quota_bounds(5, 300) == (1000, 3000)  # base at least 1000 µs
    assert burst.quota_bounds(2000, 80) == (200_000, 200_000)


def test_token_bucket() -> None:
    bucket = burst.TokenBucket(capacity=200, tokens=50, last_check=0, last_used=0)
    assert bucket.allows(now=0.5, usage_percent=300)  # under a second: nothing accounted yet
    assert not bucket.allows(now=1.5, usage_percent=200)  # 100 tokens spent in one second
    assert bucket.tokens == -50
    assert bucket.allows(now=3.5, usage_percent=10)  # 90 earned per second for 2 s, clamped at capacity
    assert bucket.tokens == 130
    assert bucket.allows(now=10, usage_percent=80)  # between 60% and 100%: neither
    started = burst.TokenBucket.start(period_seconds=60, burst_percent=300, now=0, seed="abc")
    assert started.capacity == 12000 and 0 <= started.tokens < 6000
    assert started.tokens == burst.TokenBucket.start(period_seconds=60, burst_percent=300, now=0, seed="abc").tokens
    assert not burst.TokenBucket.start(period_seconds=60, burst_percent=90, now=0, seed="x").allows(
        now=5, usage_percent=10
    )


def test_throttled_ratio_and_usage_percent() -> None:
    assert burst.throttled_ratio(None, (10, 2)) is None
    assert burst.throttled_ratio((10, 2), (20, 5)) == 0.3
    assert burst.throttled_ratio((10, 2), (10, 2)) is None
    assert burst.usage_percent(1.5, 1000) == 150 and burst.usage_percent(1.0, 0) == 0
