"""Per-node state (spec §6.4), filter (§6.5) and score (§6.6) of the load-aware extender, branch by branch."""

from __future__ import annotations

import datetime as dt
import json

import pytest

from services.loadaware import core, state
from services.loadaware.args import DEFAULT_ARGS, AggregatedArgs, LoadAwareArgs, with_defaults
from services.loadaware.state import AssignedPod, LoadState
from tests.support.loadaware import GI, node, pod, report

NOW = 1_800_000_000.0
WEB = core.incoming(pod("web", cpu="4", memory="8Gi", limit_cpu="4", limit_memory="8Gi"), DEFAULT_ARGS)
PROD = {"koordinator.sh/priority-class": "koord-prod"}


def cluster(args: LoadAwareArgs = DEFAULT_ARGS, **usage: tuple[int, int]) -> LoadState:
    """Nodes of 32 cores / 128 GiB reporting `usage` (cpu milli, memory bytes) 10 s ago."""
    load = LoadState(args)
    for name, (cpu, memory) in usage.items():
        load.apply_node(name, node(name))
        load.apply_metric(report(name, at=NOW - 10, cpu=cpu, memory=memory))
    return load


def assigned(
    key: str, cpu: int, memory: int = 0, *, at: float = NOW - 5, deadline: float | None = None, prod: bool = False
) -> AssignedPod:
    return AssignedPod(key=key, estimated={"cpu": cpu, "memory": memory}, timestamp=at, deadline=deadline, prod=prod)


# --- §6.6 worked example


def test_worked_example_passes_the_filter_with_its_numbers() -> None:
    load = cluster(n1=(12000, 64 * GI))
    verdict = core.filter_node(load, WEB, "n1", now=NOW, explain=True)
    assert verdict.passed
    assert "cpu 48% = (usage 12000 + assigned 0 + pod 3400) / 32000 ≤ 65" in verdict.detail
    assert "memory 54%" in verdict.detail


def test_worked_example_scores_48_and_5_on_the_extender_scale() -> None:
    load = cluster(n1=(12000, 64 * GI))
    score = core.score_node(load, WEB, "n1", now=NOW, explain=True)
    assert score.score == 48
    assert score.detail.startswith("score 48 = (cpu 51×1 + memory 45×1 + dominant 0×45) / 2")
    assert core.extender_score(score.score) == 5
    assert [core.extender_score(s) for s in (0, 4, 5, 94, 95, 100)] == [0, 0, 1, 9, 10, 10]


# --- node_load (§6.4 addPod)


def test_unreported_pod_adds_its_estimate() -> None:
    view = state.metric_view(report("n", at=NOW, cpu=1000, memory=GI))
    load = state.node_load(view, [assigned("default/a", 500, 100, at=NOW - 3600)], include_sys=False)
    assert load.node_delta == {"cpu": 500, "memory": 100} and load.node_estimated == {"cpu": 500, "memory": 100}


def test_reported_old_pod_adds_nothing_but_a_recent_one_adds_what_exceeds_its_usage() -> None:
    usages = {"default/a": (200, 50), "default/b": (200, 50)}
    view = state.metric_view(report("n", at=NOW, cpu=1000, memory=GI, pods=usages))
    pods = [assigned("default/a", 500, 100, at=NOW - 3600), assigned("default/b", 500, 10, at=NOW - 30)]
    load = state.node_load(view, pods, include_sys=False)
    assert load.node_delta == {"cpu": 300, "memory": 0}  # b only: max(500-200, 0), max(10-50, 0)
    assert load.node_estimated == {"cpu": 1000, "memory": 110}


def test_estimation_deadline_keeps_an_old_reported_pod_counted() -> None:
    view = state.metric_view(report("n", at=NOW, cpu=1000, memory=GI, pods={"default/a": (200, 50)}))
    pod_a = assigned("default/a", 500, 100, at=NOW - 3600, deadline=NOW + 1)
    assert state.node_load(view, [pod_a], include_sys=False).node_delta == {"cpu": 300, "memory": 50}
    expired = assigned("default/a", 500, 100, at=NOW - 3600, deadline=NOW)
    assert state.node_load(view, [expired], include_sys=False).node_delta == {}


def test_prod_usage_counts_reported_prod_pods_and_system_when_asked() -> None:
    view = state.metric_view(
        report(
            "n",
            at=NOW,
            cpu=9000,
            memory=GI,
            system=(100, 10),
            prod_pods=frozenset({"default/p"}),
            pods={"default/p": (2000, 300), "default/q": (700, 70)},
        )
    )
    pods = [assigned("default/p", 2500, 200, at=NOW - 3600, prod=True), assigned("default/q", 1000, 100, prod=True)]
    load = state.node_load(view, pods, include_sys=True)
    assert load.prod_usage == {"cpu": 2100, "memory": 310}  # system + p
    # q is prod but not reported as prod: its usage is ignored and its whole estimate counts
    assert load.prod_delta == {"cpu": 1000, "memory": 100}
    assert state.node_load(view, pods, include_sys=False).prod_usage == {"cpu": 2000, "memory": 300}


def test_longest_duration_is_the_default_aggregation() -> None:
    aggregated = {300: {"p95": (10, 10)}, 1800: {"p95": (30, 30), "avg": (0, 0)}}
    view = state.metric_view(report("n", at=NOW, cpu=1, memory=1, aggregated=aggregated))
    assert view.aggregated[("p95", 0)] == {"cpu": 30, "memory": 30}
    assert view.aggregated[("p95", 300)] == {"cpu": 10, "memory": 10}


def test_assume_then_watch_event_keeps_the_first_timestamp_and_moves_between_nodes() -> None:
    load = cluster(a=(0, 0), b=(0, 0))
    load.assume("u1", assigned("default/x", 1000, at=NOW - 1), node="a")
    load.assume("u1", assigned("default/x", 1000, at=NOW), node="a")
    assert load.nodes["a"].pods["u1"].timestamp == NOW - 1
    load.assume("u1", assigned("default/x", 1000), node="b")
    assert "u1" not in load.nodes["a"].pods and load.pod_node("u1") == "b"
    load.forget_pod("u1")
    assert load.nodes["b"].pods == {}


def test_finished_and_unassigned_pods_are_dropped() -> None:
    load = cluster(a=(0, 0))
    load.apply_pod("u", pod("x", cpu="1", node_name="a", phase="Running"), node="a", seen_at=NOW)
    assert load.load_of("a") is not None and load.load_of("a").node_delta["cpu"] == 850  # type: ignore[union-attr]
    load.apply_pod("u", pod("x", cpu="1", node_name="a", phase="Succeeded"), node="a", seen_at=NOW)
    assert load.load_of("a").node_delta == {}  # type: ignore[union-attr]


def test_pod_scheduled_condition_dates_the_assignment() -> None:
    conditions = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2027-01-15T07:00:00Z"}]
    entry = state.assigned_pod(pod("x", cpu="1", conditions=conditions), seen_at=NOW, args=DEFAULT_ARGS)
    assert entry.timestamp == dt.datetime(2027, 1, 15, 7, tzinfo=dt.UTC).timestamp() != NOW
    assert state.assigned_pod(pod("y", cpu="1"), seen_at=NOW, args=DEFAULT_ARGS).timestamp == NOW
    args = with_defaults(LoadAwareArgs(estimated_seconds_after_pod_scheduled=120))
    windowed = state.assigned_pod(pod("x", cpu="1", conditions=conditions), seen_at=NOW, args=args)
    assert windowed.deadline == windowed.timestamp + 120


# --- filter branches (§6.5)


def test_daemonset_pods_always_pass() -> None:
    load = cluster(n=(32000, 128 * GI))
    ds = core.incoming(pod("ds", cpu="1", owner_kind="DaemonSet"), DEFAULT_ARGS)
    assert core.filter_node(load, ds, "n", now=NOW).passed
    assert not core.filter_node(load, WEB, "n", now=NOW).passed


def test_cpu_over_threshold_fails_with_koordinators_reason() -> None:
    load = cluster(n=(18000, 0))  # (18000 + 3400) / 32000 = 67% > 65
    verdict = core.filter_node(load, WEB, "n", now=NOW)
    assert (verdict.passed, verdict.reason) == (False, "node(s) cpu usage exceed threshold")


def test_all_zero_thresholds_pass() -> None:
    load = cluster(with_defaults(LoadAwareArgs(usage_thresholds={"cpu": 0})), n=(32000, 0))
    assert core.filter_node(load, WEB, "n", now=NOW).reason == "no thresholds"


def test_node_without_nodemetric_passes_and_unknown_node_is_named() -> None:
    load = cluster(n=(0, 0))
    load.apply_node("bare", node("bare"))
    assert core.filter_node(load, WEB, "bare", now=NOW).reason == "no NodeMetric"
    unknown = core.filter_node(load, WEB, "ghost", now=NOW)
    assert unknown.passed and unknown.reason == core.REASON_UNKNOWN
    assert core.score_node(load, WEB, "ghost", now=NOW) == core.Score(score=0, reason=core.REASON_UNKNOWN)


@pytest.mark.parametrize(
    ("age", "filter_expired", "allow", "passed"),
    [(179.9, True, False, True), (180, True, False, False), (180, True, True, True), (500, False, False, True)],
)
def test_expired_nodemetric(age: float, filter_expired: bool, allow: bool, passed: bool) -> None:
    args = with_defaults(
        LoadAwareArgs(filter_expired_node_metrics=filter_expired, enable_schedule_when_node_metrics_expired=allow)
    )
    load = cluster(args, n=(0, 0))
    verdict = core.filter_node(load, WEB, "n", now=NOW - 10 + age)
    assert verdict.passed is passed
    if not passed:
        assert verdict.reason == core.REASON_EXPIRED
    # the score ignores the filter flags: expired is 0
    assert (core.score_node(load, WEB, "n", now=NOW - 10 + age).score == 0) is (age >= 180)


def test_prod_pods_use_prod_thresholds_on_prod_usage() -> None:
    args = with_defaults(LoadAwareArgs(prod_usage_thresholds={"cpu": 30}))
    load = LoadState(args)
    load.apply_node("n", node("n"))
    load.apply_metric(
        report("n", at=NOW - 10, cpu=30000, memory=0, prod_pods=frozenset({"default/p"}), pods={"default/p": (8000, 0)})
    )
    load.assume("p", assigned("default/p", 8000, prod=True, at=NOW - 3600), node="n")
    prod = core.incoming(pod("api", cpu="2", labels=PROD), args)
    verdict = core.filter_node(load, prod, "n", now=NOW, explain=True)
    # prod usage 8000 + pod 1700 = 30% of 32000: passes although node usage 94% would fail the cpu threshold 65
    assert verdict.passed and "cpu 30% = (prod usage 8000" in verdict.detail
    assert not core.filter_node(load, WEB, "n", now=NOW).passed
    load.apply_metric(
        report("n", at=NOW - 5, cpu=30000, memory=0, prod_pods=frozenset({"default/p"}), pods={"default/p": (8500, 0)})
    )
    assert core.filter_node(load, prod, "n", now=NOW).reason == "node(s) cpu usage exceed threshold"


def test_aggregated_thresholds_and_their_reason() -> None:
    args = with_defaults(
        LoadAwareArgs(aggregated=AggregatedArgs(usage_thresholds={"cpu": 50}, usage_aggregation_type="p95"))
    )
    load = LoadState(args)
    load.apply_node("n", node("n"))
    load.apply_metric(report("n", at=NOW - 10, cpu=1000, memory=0, aggregated={300: {"p95": (14000, 0)}}))
    verdict = core.filter_node(load, WEB, "n", now=NOW)  # (14000 + 3400) / 32000 = 54% > 50
    assert verdict.reason == "node(s) cpu aggregated usage exceed threshold"


def test_aggregation_missing_for_a_set_duration_falls_back_to_assigned_estimates() -> None:
    args = with_defaults(
        LoadAwareArgs(
            aggregated=AggregatedArgs(
                usage_thresholds={"cpu": 50}, usage_aggregation_type="p95", usage_aggregated_duration="10m"
            )
        )
    )
    load = LoadState(args)
    load.apply_node("n", node("n"))
    load.apply_metric(report("n", at=NOW - 10, cpu=31000, memory=0, aggregated={300: {"p95": (31000, 0)}}))
    load.assume("x", assigned("default/x", 10000, at=NOW - 3600), node="n")
    verdict = core.filter_node(load, WEB, "n", now=NOW, explain=True)
    assert verdict.passed and "estimates of assigned pods 0 + assigned 10000 + pod 3400" in verdict.detail


def test_node_annotation_overrides_the_thresholds() -> None:
    load = cluster(n=(12000, 0))
    annotation = {state.ANNOTATION_USAGE_THRESHOLDS: json.dumps({"usageThresholds": {"cpu": 40}})}
    load.apply_node("n", node("n", annotations=annotation))
    assert core.filter_node(load, WEB, "n", now=NOW).reason == "node(s) cpu usage exceed threshold"
    aggregated = {"aggregatedUsage": {"usageThresholds": {"cpu": 40}, "usageAggregationType": "p95"}}
    load.apply_node("n", node("n", annotations={state.ANNOTATION_USAGE_THRESHOLDS: json.dumps(aggregated)}))
    load.apply_metric(report("n", at=NOW - 5, cpu=12000, memory=0, aggregated={300: {"p95": (1000, 0)}}))
    assert core.filter_node(load, WEB, "n", now=NOW).passed  # p95 1000 + 3400 = 14%
    load.apply_node("n", node("n", annotations={state.ANNOTATION_USAGE_THRESHOLDS: "{bad"}))
    assert "n" in load.annotation_errors and core.filter_node(load, WEB, "n", now=NOW).passed


def test_parse_overrides_ignores_an_aggregated_section_without_type() -> None:
    overrides, error = state.parse_overrides(json.dumps({"aggregatedUsage": {"usageThresholds": {"cpu": 1}}}))
    assert error == "" and overrides is not None and overrides.aggregation_type == ""
    assert core.filter_profile(DEFAULT_ARGS, overrides, prod=False).thresholds == {"cpu": 65, "memory": 95}


# --- score (§6.6)


def test_dominant_weight_uses_the_smallest_share_even_of_unweighted_resources() -> None:
    args = with_defaults(LoadAwareArgs(resource_weights={"cpu": 1}, dominant_resource_weight=1))
    load = cluster(args, n=(12000, 64 * GI))
    # cpu 51, memory 45 (weight 0): (51×1 + 1×45) / 2 = 48
    assert core.score_node(load, WEB, "n", now=NOW).score == 48


def test_a_resource_over_allocatable_scores_zero() -> None:
    load = cluster(n=(31000, 64 * GI))  # cpu 34400 > 32000 → 0; memory 45 → (0 + 45) / 2
    assert core.score_node(load, WEB, "n", now=NOW).score == 22


def test_assigned_pods_lower_the_score_until_the_nodemetric_shows_them() -> None:
    load = cluster(n=(12000, 64 * GI))
    load.assume("x", assigned("default/x", 8000, 0, at=NOW - 1), node="n")
    assert core.score_node(load, WEB, "n", now=NOW).score == (26 + 45) // 2
    load.apply_metric(report("n", at=NOW, cpu=20000, memory=64 * GI, pods={"default/x": (8000, 0)}))
    # reported now, but assigned within the last report interval: still max(estimate − usage, 0) = 0 on top
    assert core.score_node(load, WEB, "n", now=NOW).score == (26 + 45) // 2


def test_a_burst_spreads_over_nodes() -> None:
    load = cluster(a=(8000, 32 * GI), b=(9000, 32 * GI), c=(10000, 32 * GI))
    placed: dict[str, int] = {"a": 0, "b": 0, "c": 0}
    for i in range(20):
        incoming = core.incoming(pod(f"p{i}", cpu="1", memory="1Gi"), DEFAULT_ARGS)
        ranked = sorted(placed, key=lambda n: -core.score_node(load, incoming, n, now=NOW).score)
        best = ranked[0]
        placed[best] += 1
        load.assume(f"u{i}", assigned(f"default/p{i}", 850, 751619277, at=NOW), node=best)
    assert min(placed.values()) >= 5, placed
