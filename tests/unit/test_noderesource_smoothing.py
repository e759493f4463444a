"""Opt-in smoothing of batch/mid decreases: off by default, a rate limit on falls, a floor at what pods request,
never applied to removals, and every held value explained."""

from __future__ import annotations

import msgspec
import pytest

from schemas import kube, vocab
from schemas.cluster import PodObserved
from services.noderesource.smoothing import SmoothingPolicy, smooth
from services.noderesource.state import ClusterState, LastWrite
from tests.unit.test_noderesource_state import GI, NODE, T0, config_event, metric_event, node_event, pod_event

CAPACITY = {"cpu": 100_000, "memory": 400 * GI}
BATCH_CPU, BATCH_MEMORY, MID_CPU = vocab.BATCH_CPU, vocab.BATCH_MEMORY, vocab.MID_CPU


def run(
    computed: dict[str, int | None], policy: SmoothingPolicy, **kw: object
) -> tuple[dict[str, int | None], dict[str, str]]:
    args: dict[str, object] = {
        "capacity": CAPACITY,
        "requested": {},
        "last_written": {},
        "last_written_at": None,
        "now": T0,
    } | kw
    return smooth(computed, policy=policy, **args)  # type: ignore[arg-type]


def test_off_by_default_changes_nothing() -> None:
    policy = SmoothingPolicy()
    assert not policy.enabled
    computed = {BATCH_CPU: 1_000, BATCH_MEMORY: 1 * GI}
    assert run(computed, policy, last_written={BATCH_CPU: 50_000}, last_written_at=T0 - 60) == (computed, {})


def test_a_fall_is_limited_per_minute_of_capacity_and_a_rise_is_not() -> None:
    policy = SmoothingPolicy(max_decrease_percent_per_minute=5)  # 5 cores of 100 per minute
    held, notes = run(
        {BATCH_CPU: 10_000, BATCH_MEMORY: 300 * GI},
        policy,
        last_written={BATCH_CPU: 40_000, BATCH_MEMORY: 100 * GI},
        last_written_at=T0 - 120,
    )
    assert held == {BATCH_CPU: 30_000, BATCH_MEMORY: 300 * GI}  # 40 cores − 2 min × 5 cores; memory rose freely
    assert list(notes) == [BATCH_CPU] and "instead of 10000" in notes[BATCH_CPU] and "40000" in notes[BATCH_CPU]


def test_a_fall_within_the_limit_passes() -> None:
    policy = SmoothingPolicy(max_decrease_percent_per_minute=50)
    assert run({BATCH_CPU: 30_000}, policy, last_written={BATCH_CPU: 40_000}, last_written_at=T0 - 60) == (
        {BATCH_CPU: 30_000},
        {},
    )


def test_batch_never_falls_below_what_pods_request_but_mid_may() -> None:
    policy = SmoothingPolicy(floor_at_batch_requests=True)
    held, notes = run(
        {BATCH_CPU: 2_000, BATCH_MEMORY: 1 * GI, MID_CPU: 0},
        policy,
        requested={BATCH_CPU: 8_000, BATCH_MEMORY: 4 * GI, MID_CPU: 3_000, "cpu": 50_000},
    )
    assert held == {BATCH_CPU: 8_000, BATCH_MEMORY: 4 * GI, MID_CPU: 0}
    assert "pods request 8000" in notes[BATCH_CPU]


def test_removals_pass_through_untouched() -> None:
    policy = SmoothingPolicy(max_decrease_percent_per_minute=1, floor_at_batch_requests=True)
    held, notes = run(
        {BATCH_CPU: None, BATCH_MEMORY: None},
        policy,
        requested={BATCH_CPU: 8_000},
        last_written={BATCH_CPU: 40_000},
        last_written_at=T0,
    )
    assert held == {BATCH_CPU: None, BATCH_MEMORY: None} and notes == {}


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf")])
def test_a_bad_rate_is_refused(bad: float) -> None:
    with pytest.raises(ValueError, match="max_decrease_percent_per_minute"):
        SmoothingPolicy(max_decrease_percent_per_minute=bad)


def _batch_pod(name: str, batch_cpu: int, batch_memory: int) -> PodObserved:
    event = pod_event(name, "0", "0", priority="koord-batch")
    assert event.pod is not None
    pod = msgspec.convert(
        msgspec.to_builtins(event.pod)
        | {
            "spec": {
                "nodeName": NODE,
                "containers": [
                    {
                        "name": "main",
                        "resources": {"requests": {BATCH_CPU: str(batch_cpu), BATCH_MEMORY: str(batch_memory)}},
                    }
                ],
            }
        },
        kube.Pod,
    )
    return msgspec.structs.replace(event, pod=pod)


def _state(policy: SmoothingPolicy) -> ClusterState:
    state = ClusterState(smoothing=policy)
    for event in (
        config_event(),
        node_event(),
        pod_event("a", "40", "100Gi"),
        pod_event("b", "20", "40Gi"),
        _batch_pod("spark", 30_000, 150 * GI),
        metric_event(),
    ):
        state.apply(event)
    return state


def test_decisions_carry_the_held_values_and_why() -> None:
    # Koordinator's number for this node is 25 cores / 146 GiB (§2.6); the batch pod already holds 30 cores.
    plain = _state(SmoothingPolicy()).decide(NODE, now=T0, last_written=None)
    assert plain is not None and plain.resources[BATCH_CPU] == 25_000 and plain.smoothing == {}

    floored = _state(SmoothingPolicy(floor_at_batch_requests=True)).decide(NODE, now=T0, last_written=None)
    assert floored is not None
    assert floored.resources[BATCH_CPU] == 30_000 and floored.resources[BATCH_MEMORY] == 150 * GI
    assert set(floored.smoothing) == {BATCH_CPU, BATCH_MEMORY}

    limited = _state(SmoothingPolicy(max_decrease_percent_per_minute=10)).decide(
        NODE, now=T0, last_written=LastWrite(at=T0 - 30, resources={BATCH_CPU: 60_000, BATCH_MEMORY: 146 * GI})
    )
    assert limited is not None and limited.resources[BATCH_CPU] == 55_000  # 60 cores − ½ min × 10 cores
    assert "instead of 25000" in limited.smoothing[BATCH_CPU]


def test_a_degraded_node_loses_its_resources_whatever_the_policy() -> None:
    state = _state(SmoothingPolicy(max_decrease_percent_per_minute=1, floor_at_batch_requests=True))
    late = T0 + 16 * 60  # NodeMetric older than degradeTimeMinutes (15)
    decision = state.decide(NODE, now=late, last_written=LastWrite(at=T0, resources={BATCH_CPU: 60_000}))
    assert decision is not None and decision.outcome == "degraded"
    assert decision.resources[BATCH_CPU] is None and decision.smoothing == {}
