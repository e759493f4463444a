"""LoadAwareSchedulingArgs defaults and the DefaultEstimator (spec §6.2, §6.3)."""

from __future__ import annotations

import json

import msgspec
import pytest

from services.common.args import ArgsError, duration_seconds
from services.loadaware import estimator
from services.loadaware.args import DEFAULT_ARGS, LoadAwareArgs, load_args, with_defaults
from tests.support.loadaware import GI, node, pod

MI = 1 << 20
BATCH_REQUESTS = {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "4Gi"}


def test_defaults_follow_koordinator() -> None:
    args = DEFAULT_ARGS
    assert args.resource_weights == {"cpu": 1, "memory": 1}
    assert args.usage_thresholds == {"cpu": 65, "memory": 95}
    assert args.estimated_scaling_factors == {"cpu": 85, "memory": 70}
    assert args.filter_expired_node_metrics and args.node_metric_expiration_seconds == 180
    assert not args.enable_schedule_when_node_metrics_expired and args.prod_usage_thresholds == {}


def test_weights_are_not_defaulted_when_a_dominant_weight_is_given() -> None:
    args = with_defaults(LoadAwareArgs(dominant_resource_weight=2))
    assert args.resource_weights == {}
    assert with_defaults(LoadAwareArgs(resource_weights={"cpu": 3})).resource_weights == {"cpu": 3}


def test_user_scaling_factors_are_completed_and_thresholds_replaced() -> None:
    args = load_args("estimatedScalingFactors: {cpu: 50}\nusageThresholds: {memory: 80}\n")
    assert args.estimated_scaling_factors == {"cpu": 50, "memory": 70}
    assert args.usage_thresholds == {"memory": 80}


def test_vector_is_the_sorted_union_of_every_map() -> None:
    args = load_args(json.dumps({"usageThresholds": {"nvidia.com/gpu": 50}, "supportedResources": ["ephemeral"]}))
    assert args.vector() == ("cpu", "ephemeral", "memory", "nvidia.com/gpu")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("usageThresholds: {cpu: 120}", "usageThresholds.cpu: 120 is outside 0..100"),
        ("nodeMetricExpirationSeconds: 0", "must be positive"),
        ("aggregated: {usageAggregationType: p42}", "'p42' is not one of"),
        ("aggregated: {usageAggregatedDuration: five}", "is not a duration"),
        ("[1, 2]", "expected an object"),
        ("usageThresholds: {cpu: high}", "usageThresholds"),
    ],
)
def test_bad_args_name_the_field(text: str, message: str) -> None:
    with pytest.raises(ArgsError, match=message.replace("(", r"\(").replace(".", r"\.")):
        load_args(text, source="args.yaml")


def test_durations() -> None:
    assert duration_seconds("5m") == 300
    assert duration_seconds("1h30m") == 5400
    assert duration_seconds("") == 0


def test_estimate_of_the_worked_example() -> None:
    est = estimator.estimate_pod(pod("web", cpu="4", memory="8Gi", limit_cpu="4", limit_memory="8Gi"), DEFAULT_ARGS)
    assert est == {"cpu": 3400, "memory": round(8 * GI * 0.7)}


def test_a_pod_without_requests_gets_kubernetes_defaults() -> None:
    assert estimator.estimate_pod(pod("idle"), DEFAULT_ARGS) == {"cpu": 250, "memory": 200 * MI}


def test_limit_counts_when_larger_than_request_and_caps_the_estimate() -> None:
    # max(request 1, limit 2) × 85% = 1700m
    assert estimator.estimate_pod(pod("a", cpu="1", limit_cpu="2"), DEFAULT_ARGS)["cpu"] == 1700
    args = with_defaults(LoadAwareArgs(estimated_scaling_factors={"cpu": 100}))
    # a request above its limit: the estimate is capped at the limit
    assert estimator.estimate_pod(pod("b", cpu="3", limit_cpu="1"), args)["cpu"] == 1000


def test_batch_pods_are_estimated_on_batch_resources() -> None:
    raw = pod("be", labels={"koordinator.sh/priority-class": "koord-batch"})
    batch = msgspec.structs.replace(
        raw,
        spec=msgspec.structs.replace(
            raw.spec,
            containers=[
                msgspec.convert(
                    {"name": "c", "resources": {"requests": BATCH_REQUESTS}},
                    type(raw.spec.containers[0]),  # type: ignore[index]
                )
            ],
        ),
    )
    assert estimator.estimate_pod(batch, DEFAULT_ARGS) == {"cpu": 1700, "memory": round(4 * GI * 0.7)}
    # a batch pod asking for nothing gets the defaults on batch-cpu/batch-memory, keyed by the plain names
    assert estimator.estimate_pod(raw, DEFAULT_ARGS) == {"cpu": 250, "memory": 200 * MI}


def test_mid_pod_without_mid_resources_estimates_nothing() -> None:
    mid = pod("mid", cpu="2", labels={"koordinator.sh/priority-class": "koord-mid"})
    assert estimator.estimate_pod(mid, DEFAULT_ARGS) == {}


def test_pod_annotations_customize_only_when_allowed() -> None:
    annotated = pod("a", cpu="2", annotations={estimator.ANNOTATION_SCALING_FACTORS: '{"cpu": 50}'})
    assert estimator.estimate_pod(annotated, DEFAULT_ARGS)["cpu"] == 1700
    allowed = with_defaults(LoadAwareArgs(allow_customize_estimation=True))
    assert estimator.estimate_pod(annotated, allowed)["cpu"] == 1000
    broken = pod("b", cpu="2", annotations={estimator.ANNOTATION_SCALING_FACTORS: "{nope"})
    assert estimator.estimate_pod(broken, allowed)["cpu"] == 1700


def test_node_allocatable_uses_raw_allocatable() -> None:
    amplified = node("n", cpu="64", annotations={estimator.ANNOTATION_RAW_ALLOCATABLE: '{"cpu": "32"}'})
    assert estimator.estimate_node(amplified)["cpu"] == 32000
    assert estimator.estimate_node(node("m"))["memory"] == 128 * GI
