"""The migration service's LowNodeLoad adaptation (services.migration.lownodeload_round): the args file's
`lowNodeLoadArgs` section and its refusals, the watermark override, the service's state as the Balance round's
inputs, the detectors kept across rounds, dryRun and the eviction limits."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import msgspec
import pytest
import yaml

from koordbus.parts import migration_settings
from schemas import kube
from schemas.node import (
    MetricCollectPolicy,
    NodeMetricComputed,
    NodeMetricInfo,
    NodeMetricStatus,
    PodMetric,
    ResourceMap,
)
from services.common.args import ArgsError
from services.common.watermarks import WatermarkConfig, Watermarks
from services.migration import lownodeload_balance as balance
from services.migration import lownodeload_round as lnl
from tests.support.migration import pod

NOW = 2_000_000_000.0


def section(text: str) -> lnl.Descheduling | None:
    return lnl.read_section(yaml.safe_load(text), source="args.yaml")


def node(name: str, *, labels: dict[str, str] | None = None) -> kube.Node:
    return msgspec.convert(
        {
            "metadata": {"name": name, "labels": labels or {}},
            "status": {"allocatable": {"cpu": "10", "memory": "100Gi", "pods": "110"}},
        },
        kube.Node,
    )


def metric(name: str, pods: dict[str, int], *, system_cpu: int = 0, at: float = NOW) -> NodeMetricComputed:
    """cpu in millicores per pod."""
    return NodeMetricComputed(
        node=name,
        report_time=at,
        spec=MetricCollectPolicy(),
        status=NodeMetricStatus(
            update_time=at,
            node_metric=NodeMetricInfo(
                node_usage=ResourceMap(resources={}),
                aggregated_node_usages=[],
                system_usage=ResourceMap(resources={"cpu": system_cpu, "memory": 2**30}),
                aggregated_system_usages=[],
            ),
            pods_metric=[
                PodMetric(namespace="default", name=p, pod_usage=ResourceMap(resources={"cpu": c, "memory": 2**28}))
                for p, c in pods.items()
            ],
        ),
    )


HOT = {"b1": 2000, "b2": 2000, "b3": 2000, "b4": 2000}
"""cpu 8 of 10 on the hot node (80 %)."""


def cluster() -> tuple[list[kube.Node], dict[str, NodeMetricComputed], list[kube.Pod]]:
    pods = [pod(n, node="hot", priority=5500) for n in HOT] + [pod("c1", node="cold", priority=5500)]
    metrics = {"hot": metric("hot", HOT), "cold": metric("cold", {"c1": 500})}
    return [node("hot"), node("cold")], metrics, pods


def run(
    descheduling: lnl.Descheduling, detectors: lnl.Detectors, *, now: float = NOW, marks: Watermarks | None = None
) -> lnl.Decision:
    nodes, metrics, pods = cluster()
    return lnl.run_round(
        lnl.effective_args(descheduling, marks or Watermarks()),
        nodes=nodes,
        metrics=metrics,
        pods=pods,
        limits=descheduling.limits,
        detectors=detectors,
        cache_timeout=descheduling.detector_cache_timeout,
        now=now,
    )


ARGS = """
maxMigratingPerNode: 3
deschedulingInterval: 30s
maxNoOfPodsToEvictPerNode: 5
lowNodeLoadArgs:
  highThresholds: {cpu: 50}
  lowThresholds: {cpu: 20}
  anomalyCondition: {consecutiveAbnormalities: 1}
"""


# --- the args section


def test_the_section_is_koordinators_args_with_its_defaults() -> None:
    got = section(ARGS)
    assert got is not None
    assert got.interval_seconds == 30
    assert got.limits == balance.Limits(per_node=5)
    assert got.detector_cache_timeout == 300
    args = lnl.effective_args(got, Watermarks())
    assert args.node_fit is True and args.expiration_seconds == 180 and not args.dry_run
    assert [p.name for p in args.pools] == ["__default_node_pool__"]
    assert args.pools[0].high == {"cpu": 50} and args.pools[0].weights == {"cpu": 1, "memory": 1}


def test_no_section_is_none_and_the_interval_defaults_to_a_minute() -> None:
    assert section("maxMigratingPerNode: 2\n") is None
    got = section("lowNodeLoadArgs: {}\n")
    assert got is not None and got.interval_seconds == 60 and got.limits == balance.Limits()


def test_both_sections_are_refused_naming_what_to_write() -> None:
    with pytest.raises(ArgsError, match="both lowNodeLoad and lowNodeLoadArgs are set: write only lowNodeLoadArgs"):
        section("lowNodeLoad: {enabled: true}\nlowNodeLoadArgs: {}\n")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            "lowNodeLoadArgs: {highThresholds: {cpu: 30}, lowThresholds: {cpu: 40}}",
            "args.yaml: lowNodeLoadArgs: nodePools[0].lowThresholds[cpu]: Invalid value: 40: low percentage must be "
            "less than or equal to highThresholds",
        ),
        ("lowNodeLoadArgs: {numberOfNodes: -1}", "numberOfNodes: Invalid value: -1"),
        (
            "lowNodeLoadArgs: {highThresholds: [1]}",
            "lowNodeLoadArgs: Expected `object | null`, got `array` - at `$.highThresholds`",
        ),
        ("lowNodeLoadArgs: {detectorCacheTimeout: soon}", "detectorCacheTimeout: invalid duration 'soon'"),
        ("lowNodeLoadArgs: {anomalyCondition: {timeout: x}}", "lowNodeLoadArgs.anomalyCondition.timeout"),
        ("deschedulingInterval: 0s\nlowNodeLoadArgs: {}", "deschedulingInterval must be positive"),
        ("maxNoOfPodsToEvictPerNode: -1\nlowNodeLoadArgs: {}", "maxNoOfPodsToEvictPerNode"),
    ],
)
def test_unusable_args_are_refused_with_koordinators_message(text: str, message: str) -> None:
    with pytest.raises(ArgsError) as caught:
        section(text)
    assert message in str(caught.value)


def test_the_args_file_fills_the_settings(tmp_path: Path) -> None:
    path = tmp_path / "args.yaml"
    path.write_text(ARGS)
    settings = migration_settings(str(path))
    assert settings.args.max_migrating_per_node == 3
    assert settings.low_node_load_args is not None and settings.low_node_load_args.interval_seconds == 30
    assert not settings.low_node_load.enabled
    path.write_text("lowNodeLoad: {enabled: true, anomalyRounds: 2}\n")  # the older section keeps working
    older = migration_settings(str(path))
    assert older.low_node_load_args is None and older.low_node_load.anomaly_rounds == 2
    path.write_text("lowNodeLoadArgs: {lowThresholds: {cpu: 90}, highThresholds: {cpu: 10}}\n")
    with pytest.raises(SystemExit, match="low percentage must be less than or equal to highThresholds"):
        migration_settings(str(path))


# --- the watermark override


def test_the_watermarks_override_the_top_level_thresholds_they_name() -> None:
    got = section(
        ARGS
        + "  nodeMetricExpirationSeconds: 60\n"
        + "  nodePools:\n"
        + "  - {name: gpu, highThresholds: {cpu: 90}, lowThresholds: {cpu: 10}}\n"
        + "  - {name: inherits}\n"
    )
    assert got is not None
    marks = Watermarks(usage_thresholds={"cpu": 65, "memory": 0}, low_thresholds={"cpu": 25})
    args = lnl.effective_args(got, marks)
    default, gpu, inherits = args.pools
    assert default.high == {"cpu": 65, "memory": 100} and default.low == {"cpu": 25}
    assert gpu.high == {"cpu": 90} and gpu.low == {"cpu": 10}
    assert inherits.high == default.high and args.expiration_seconds == 60
    assert lnl.effective_args(got, Watermarks(node_metric_expiration_seconds=30)).expiration_seconds == 30
    assert got.raw.high_thresholds == {"cpu": 50}  # the args as written stay as written


def test_a_watermark_that_breaks_validation_stops_the_round() -> None:
    got = section(ARGS)
    assert got is not None
    decision = run(got, lnl.Detectors(), marks=Watermarks(low_thresholds={"cpu": 80}))
    assert decision.problems and "low percentage must be less than or equal to highThresholds" in decision.problems[0]
    assert decision.evictions == ()


# --- the round over the service's view


def test_a_hot_node_is_relieved_into_the_cold_one_with_reasons() -> None:
    got = section(ARGS)
    assert got is not None
    decision = run(got, lnl.Detectors())
    pool = decision.pools[0]
    assert pool.classes["highNodes"] == ["hot"] and pool.classes["bothLowNodes"] == ["cold"]
    assert pool.abnormal_nodes == ["hot"]
    # 80 % → at most 50 %: pods go until the node is no longer over (nodeFit: the cold node takes two of them)
    assert [e.pod for e in decision.evictions] == ["default/b1", "default/b2"]
    assert decision.evictions[0].reason == "node is overutilized, node cpu usage(80.00%)>threshold(50.00%)"
    assert decision.evictions[1].reason == "node is overutilized, node cpu usage(60.00%)>threshold(50.00%)"


def test_the_eviction_limits_hold_per_round() -> None:
    got = section(ARGS.replace("maxNoOfPodsToEvictPerNode: 5", "maxNoOfPodsToEvictPerNode: 1"))
    assert got is not None
    assert [e.pod for e in run(got, lnl.Detectors()).evictions] == ["default/b1"]
    assert [e.pod for e in run(got, lnl.Detectors()).evictions] == ["default/b1"]  # a new round, a new count


def test_dry_run_evaluates_everything_and_ignores_the_limits() -> None:
    got = section(ARGS.replace("maxNoOfPodsToEvictPerNode: 5", "maxNoOfPodsToEvictPerNode: 1") + "  dryRun: true\n")
    assert got is not None
    decision = run(got, lnl.Detectors())
    assert decision.dry_run and len(decision.evictions) == 2


def test_the_detectors_count_abnormal_rounds_across_rounds() -> None:
    got = section(ARGS.replace("consecutiveAbnormalities: 1", "consecutiveAbnormalities: 2"))
    assert got is not None
    detectors = lnl.Detectors()
    assert run(got, detectors).evictions == ()
    assert run(got, detectors, now=NOW + 1).evictions == ()
    third = run(got, detectors, now=NOW + 2)  # 2 needs 3 rounds
    assert third.pools[0].abnormal_nodes == ["hot"] and len(third.evictions) == 2
    # after eviction the abnormal node gets one normal mark; its anomaly lasts, so the next round acts at once
    assert detectors.node["hot"].state == "anomaly" and detectors.node["hot"].normal == 1
    assert len(run(got, detectors, now=NOW + 3).evictions) == 2


def test_a_detector_not_checked_for_the_cache_timeout_is_forgotten() -> None:
    got = section(
        ARGS.replace("consecutiveAbnormalities: 1", "consecutiveAbnormalities: 3") + "  detectorCacheTimeout: 10s\n"
    )
    assert got is not None
    detectors = lnl.Detectors()
    run(got, detectors)
    run(got, detectors, now=NOW + 5)
    assert detectors.node["hot"].abnormal == 2
    nodes, _, pods = cluster()
    cool = {"hot": metric("hot", {"b1": 1000}, at=NOW + 20), "cold": metric("cold", {}, at=NOW + 20)}
    lnl.run_round(
        lnl.effective_args(got, Watermarks()),
        nodes=nodes,
        metrics=cool,
        pods=pods,
        limits=got.limits,
        detectors=detectors,
        cache_timeout=got.detector_cache_timeout,
        now=NOW + 20,
    )
    assert "hot" not in detectors.node and not detectors.checked


def test_stale_or_missing_node_metrics_take_no_part() -> None:
    got = section(ARGS)
    assert got is not None
    nodes, metrics, pods = cluster()
    stale = {"hot": metric("hot", HOT, at=NOW - 180), "cold": metrics["cold"]}
    decision = lnl.run_round(
        lnl.effective_args(got, Watermarks()),
        nodes=nodes,
        metrics=stale,
        pods=pods,
        limits=got.limits,
        detectors=lnl.Detectors(),
        now=NOW,
    )
    assert decision.pools[0].classes["highNodes"] == [] and decision.evictions == ()


def test_metric_amounts_become_quantity_values() -> None:
    view = lnl.metric_view(metric("hot", {"b1": 1500}, system_cpu=250))
    assert view.update_time == Fraction(NOW) and view.has_node_metric
    assert view.system_usage == {"cpu": Fraction(1, 4), "memory": Fraction(2**30)}
    assert view.pods == [("default/b1", {"cpu": Fraction(3, 2), "memory": Fraction(2**28)})]


def test_service_objects_become_scheduling_objects() -> None:
    p = pod("b1", node="hot", priority=5500)
    converted = lnl.scheduling_pod(p)
    assert converted.spec.node_name == "hot" and converted.spec.priority == 5500 and converted.metadata == p.metadata
    assert converted.spec.tolerations is None
    n = lnl.scheduling_node(node("hot", labels={"pool": "a"}))
    assert n.metadata.labels == {"pool": "a"} and not n.spec.unschedulable


def test_a_pod_with_a_job_is_refused_with_no_accounting() -> None:
    got = section(ARGS.replace("maxNoOfPodsToEvictPerNode: 5", "maxNoOfPodsToEvictPerNode: 1"))
    assert got is not None
    nodes, metrics, pods = cluster()
    decision = lnl.run_round(
        lnl.effective_args(got, Watermarks()),
        nodes=nodes,
        metrics=metrics,
        pods=pods,
        limits=got.limits,
        detectors=lnl.Detectors(),
        refused={"default/b1"},
        now=NOW,
    )
    assert [e.pod for e in decision.evictions] == ["default/b2"]  # b1 skipped: the per-node limit is still free


def test_the_job_name_comes_from_the_pods_identity() -> None:
    a, b = pod("b1", node="hot"), pod("b1", node="cold")
    assert lnl.job_name(a) == lnl.job_name(b) and lnl.job_name(a).startswith("lownodeload-")
    assert lnl.job_name(a) != lnl.job_name(pod("b2", node="hot"))


def test_the_stated_watermarks_are_the_top_level_as_written_with_the_overrides() -> None:
    got = section(ARGS)
    assert got is not None
    config = WatermarkConfig(watermarks=Watermarks(low_thresholds={"cpu": 25}))
    stated = lnl.stated_watermarks(got, config, at=NOW)
    assert stated.usage_thresholds == {"cpu": 50} and stated.low_thresholds == {"cpu": 25}
    assert stated.stale_after_seconds == 180 and stated.enabled and stated.from_configmap == ["lowThresholds"]
    run(got, lnl.Detectors())  # a round fills missing resources into its own copy only
    assert lnl.stated_watermarks(got, config, at=NOW) == stated
