"""Where the load-aware extender's core used to differ from Koordinator's LoadAwareScheduling plugin (spec §6) and
now reads and computes as Koordinator does: one test per behaviour that changed (issue 28)."""

from __future__ import annotations

import json
from fractions import Fraction

import msgspec
import numpy as np
import pytest

from schemas.node import ResourceMap
from services.common.args import ArgsError
from services.loadaware import core, estimator, fast, source, state
from services.loadaware.args import LoadAwareArgs as Args
from services.loadaware.args import load_args, with_defaults
from services.loadaware.state import LoadState
from tests.support.loadaware import GI, node, pod, report

NOW = 1_800_000_000.0
ALLOWED = with_defaults(Args(allow_customize_estimation=True))


def test_usage_percent_is_go_float64_rounding() -> None:
    # 29 / 200 × 100 is 14.499999999999998 in float64: Go rounds it to 14, exact arithmetic would give 15
    assert core.percent(29, 200) == 14
    assert core.percent(1, 2) == 50 and core.percent(1, 200) == 1  # 0.5 rounds away from zero
    est, alloc = np.array([[29, 1, 7]], np.int64), np.array([[200, 200, 9]], np.int64)
    assert fast._go_percent(est, alloc).tolist() == [[core.percent(29, 200), 1, core.percent(7, 9)]]


def test_free_pods_and_unmapped_keys_of_batch_pods_estimate_nothing() -> None:
    args = with_defaults(Args(estimated_scaling_factors={"nvidia.com/gpu": 50}))
    free = pod("f", cpu="2", memory="1Gi", labels={"koordinator.sh/priority-class": "koord-free"})
    assert estimator.estimate_factors(free, args) == {"cpu": 0, "memory": 0, "nvidia.com/gpu": 0}
    batch = pod("b", labels={"koordinator.sh/priority-class": "koord-batch"})
    assert estimator.estimate_factors(batch, args)["nvidia.com/gpu"] == 0
    assert estimator.estimate_factors(batch, args)["cpu"] == 250  # batch-cpu's default


@pytest.mark.parametrize(
    ("annotation", "cpu"),
    [('{"cpu": 150}', 3000), ('{"cpu": 0}', 0), ('{"cpu": 65.5}', 1700), ("null", 1700), ("{}", 1700)],
)
def test_custom_scaling_factors_are_any_int64(annotation: str, cpu: int) -> None:
    # a factor over 100 is taken (capped at the limit only when there is one); a non-integer voids the annotation
    annotated = pod("a", cpu="2", annotations={estimator.ANNOTATION_SCALING_FACTORS: annotation})
    assert estimator.estimate_factors(annotated, ALLOWED)["cpu"] == cpu


@pytest.mark.parametrize(
    ("annotation", "window"), [("+30", 30), ("-5", 60), (" 12", 60), ("1_0", 60), ("١٢", 60), ("9" * 20, 60)]
)
def test_estimation_window_annotations_parse_like_go_and_fall_back_to_the_args(annotation: str, window: int) -> None:
    args = with_defaults(Args(allow_customize_estimation=True, estimated_seconds_after_pod_scheduled=60))
    annotated = pod("a", annotations={estimator.ANNOTATION_AFTER_SCHEDULED: annotation})
    assert estimator.estimation_windows(annotated, args) == (window, -1)


def test_reserve_pods_are_not_counted() -> None:
    load = LoadState(with_defaults(Args()))
    load.apply_node("n", node("n"))
    load.apply_metric(report("n", at=NOW, cpu=0, memory=0))
    reserve = pod("r", cpu="4", node_name="n", annotations={source.RESERVE_POD_ANNOTATION: "true"})
    load.apply_pod("default/r", reserve, node="n", seen_at=NOW)
    assert load.nodes["n"].pods == {}


def test_a_pod_metric_without_usage_is_no_usage() -> None:
    event = report("n", at=NOW, cpu=1000, memory=GI, pods={"default/a": (1, 1)}, prod_pods=frozenset({"default/a"}))
    empty = [msgspec.structs.replace(m, pod_usage=ResourceMap()) for m in event.status.pods_metric]
    view = state.metric_view(
        msgspec.structs.replace(event, status=msgspec.structs.replace(event.status, pods_metric=empty))
    )
    assert view.pod_usages == {} and view.prod_pods == frozenset()
    # so an old pod whose metric has no usage still counts in full, like a pod not reported at all
    old = state.AssignedPod(key="default/a", estimated={"cpu": 500}, timestamp=NOW - 3600, deadline=None, prod=False)
    assert state.node_load(view, [old], include_sys=False).node_delta == {"cpu": 500}


def test_the_longest_aggregation_is_chosen_after_every_entry() -> None:
    entries = [(Fraction(300), {"p95": {"cpu": 3}}), (Fraction(0), {"p95": {"cpu": 0}}), (Fraction(-60), {"p95": {}})]
    aggregated = state.aggregated_usages(entries)
    assert aggregated[("p95", Fraction(0))] == {"cpu": 3}  # a later 0-duration entry does not win


@pytest.mark.parametrize(
    ("annotation", "taken"),
    [
        ({"aggregatedUsage": {"usageThresholds": {"cpu": 40}, "usageAggregationType": "p42"}}, True),
        ({"UsageThresholds": {"cpu": 40}}, True),
        ({"aggregatedUsage": {"usageThresholds": {"cpu": 40}, "usageAggregationType": "p95",
                              "usageAggregatedDuration": "1.5s"}}, True),
        ({"usageThresholds": {"cpu": "40"}}, False),
        ({"usageThresholds": {"cpu": 40.5}}, False),
        ({"aggregatedUsage": {"usageThresholds": {"cpu": 40}, "usageAggregationType": "p95",
                              "usageAggregatedDuration": ""}}, False),
    ],
)  # fmt: skip
def test_usage_thresholds_annotation_reads_like_go(annotation: dict[str, object], taken: bool) -> None:
    overrides, error = state.parse_overrides(json.dumps(annotation))
    read = overrides is not None and bool(overrides.usage_thresholds or overrides.aggregated_thresholds)
    assert (read, error == "") == (taken, taken)


def test_unknown_annotated_aggregation_type_finds_no_aggregated_usage() -> None:
    load = LoadState(with_defaults(Args()))
    annotation = {"aggregatedUsage": {"usageThresholds": {"cpu": 50}, "usageAggregationType": "p42"}}
    load.apply_node("n", node("n", annotations={state.ANNOTATION_USAGE_THRESHOLDS: json.dumps(annotation)}))
    load.apply_metric(report("n", at=NOW - 5, cpu=30000, memory=0))
    web = core.incoming(pod("web", cpu="1"), load.args)
    # p42 over the longest duration is missing, so the node usage is read: (30000 + 850) / 32000 = 96% > 50
    assert core.filter_node(load, web, "n", now=NOW).reason == "node(s) cpu aggregated usage exceed threshold"


def test_prod_thresholds_all_zero_leave_prod_pods_to_the_usage_thresholds() -> None:
    args = with_defaults(Args(prod_usage_thresholds={"cpu": 0}))
    load = LoadState(args)
    load.apply_node("n", node("n"))
    load.apply_metric(report("n", at=NOW - 5, cpu=30000, memory=0))
    prod = core.incoming(pod("api", cpu="1", labels={"koordinator.sh/priority-class": "koord-prod"}), args)
    assert core.filter_node(load, prod, "n", now=NOW).reason == "node(s) cpu usage exceed threshold"


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ("resourceWeights: {cpu: 0}", False),
        ("resourceWeights: {cpu: 101}", False),
        ("dominantResourceWeight: 101", False),
        ("estimatedScalingFactors: {cpu: 0}", False),
        ("resourceWeights: {nvidia.com/gpu: 1}", False),
        ("resourceWeights: {nvidia.com/gpu: 1}\nestimatedScalingFactors: {nvidia.com/gpu: 50}", True),
        ("prodUsageThresholds: {cpu: 150}", True),
        ("estimator: whatever", True),
        ("aggregated: {usageAggregatedDuration: 1.5s}", True),
        ("aggregated: {scoreAggregatedDuration: -1m}", False),
        ("filterExpiredNodeMetrics: null\nusageThresholds: null", True),
    ],
)
def test_args_are_validated_like_koordinator(text: str, accepted: bool) -> None:
    if accepted:
        load_args(text)
    else:
        with pytest.raises(ArgsError):
            load_args(text)


def test_a_pod_scheduled_transition_dates_the_pod_and_a_kept_first_sighting_moves_its_deadline() -> None:
    args = with_defaults(Args(estimated_seconds_after_pod_scheduled=120))
    load = LoadState(args)
    load.apply_node("n", node("n"))
    bare = pod("x", cpu="1", node_name="n")
    load.apply_pod("default/x", bare, node="n", seen_at=NOW - 10)
    load.apply_pod("default/x", bare, node="n", seen_at=NOW)
    kept = load.nodes["n"].pods["default/x"]
    assert (kept.timestamp, kept.deadline) == (NOW - 10, NOW - 10 + 120)
    # 2027-01-15T08:00:00Z is NOW: the transition, later than the first sighting, dates the pod
    scheduled = [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2027-01-15T08:00:00Z"}]
    load.apply_pod("default/x", pod("x", cpu="1", node_name="n", conditions=scheduled), node="n", seen_at=NOW + 5)
    dated = load.nodes["n"].pods["default/x"]
    assert (dated.timestamp, dated.deadline, dated.dated_by_condition) == (NOW, NOW + 120, True)


def test_a_usage_thresholds_key_given_twice_merges_as_in_go() -> None:
    overrides, error = state.parse_overrides('{"usageThresholds": {"cpu": 40}, "UsageThresholds": {"memory": 60}}')
    assert error == "" and overrides is not None and overrides.usage_thresholds == {"cpu": 40, "memory": 60}
