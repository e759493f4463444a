"""One watermark model (services.common.watermarks): the load-watermarks-config key, the caps node QoS eviction puts on
the scheduler, the findings, and how the extender, the descheduler and the API's view apply them."""

from __future__ import annotations

import json

import pytest

from koordbus.common import watermark_defaults
from koordbus.scheduler import render_watermarks
from schemas.qos import WatermarksInEffect
from services.api.watermarks import build_view
from services.common import watermarks
from services.common.watermarks import EvictionFacts, Watermarks, WatermarksError, parse_watermarks
from services.loadaware import core
from services.loadaware.args import DEFAULT_ARGS, apply_watermarks
from services.loadaware.state import LoadState
from services.migration.lownodeload import LowNodeLoadArgs
from services.migration.lownodeload import apply_watermarks as apply_deschedule_watermarks
from tests.support.loadaware import GI, node, pod, report

NOW = 1_900_000_000.0
BE = EvictionFacts(best_effort=True, eviction_enabled=False, priority=0)
LS = EvictionFacts(best_effort=False, eviction_enabled=False, priority=9000)
ENABLED_LOW = EvictionFacts(best_effort=False, eviction_enabled=True, priority=5000)
QOS_ON = {"enable": True, "memoryEvictThresholdPercent": 70, "cpuEvictThresholdPercent": 80}


def test_an_absent_or_null_key_sets_nothing() -> None:
    assert parse_watermarks(None) == watermarks.ABSENT
    assert parse_watermarks("  ") == watermarks.ABSENT
    assert parse_watermarks("null") == watermarks.ABSENT
    assert watermarks.fields_set(watermarks.ABSENT) == []


def test_the_key_parses_with_its_json_names() -> None:
    marks = parse_watermarks(
        json.dumps(
            {
                "usageThresholds": {"cpu": 60, "memory": 68},
                "lowThresholds": {"cpu": 20},
                "nodeMetricExpirationSeconds": 120,
                "enableScheduleWhenNodeMetricsExpired": True,
                "avoidEvictionLoops": False,
            }
        )
    )
    assert marks == Watermarks(
        usage_thresholds={"cpu": 60, "memory": 68},
        low_thresholds={"cpu": 20},
        node_metric_expiration_seconds=120,
        enable_schedule_when_node_metrics_expired=True,
        avoid_eviction_loops=False,
    )
    assert watermarks.fields_set(marks) == [
        "enableScheduleWhenNodeMetricsExpired",
        "lowThresholds",
        "nodeMetricExpirationSeconds",
        "usageThresholds",
    ]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "not JSON"),
        ('{"usageThreshold": {"cpu": 60}}', "usageThreshold"),
        ('{"usageThresholds": {"cpu": 160}}', "$.usageThresholds.cpu: 160 is outside 0..100"),
        ('{"usageThresholds": {"cpu": "high"}}', "usageThresholds"),
        ('{"usageThresholds": {"cpu": 60}, "lowThresholds": {"cpu": 60}}', "not under usageThresholds.cpu (60)"),
        ('{"nodeMetricExpirationSeconds": 0}', "must be positive"),
        ("[1]", "Expected `object`"),
    ],
)
def test_a_bad_key_is_refused_with_the_field(text: str, message: str) -> None:
    with pytest.raises(WatermarksError) as caught:
        parse_watermarks(text)
    assert message in str(caught.value)


def test_a_key_in_error_keeps_its_last_good_value() -> None:
    good = watermarks.read_watermarks({"load-watermarks-config": '{"usageThresholds": {"cpu": 50}}'})
    assert good.watermarks.usage_thresholds == {"cpu": 50} and not good.errors
    bad = watermarks.read_watermarks(
        {"load-watermarks-config": '{"usageThresholds": {"cpu": 500}}', "resource-threshold-config": "{"}, good
    )
    assert bad.watermarks.usage_thresholds == {"cpu": 50}
    assert set(bad.errors) == {"load-watermarks-config", "resource-threshold-config"}
    assert bad.thresholds == good.thresholds
    assert watermarks.read_watermarks(None).watermarks == watermarks.ABSENT


def test_node_strategies_are_picked_by_labels_in_order() -> None:
    config = watermarks.read_watermarks(
        {
            "resource-threshold-config": json.dumps(
                {
                    "clusterStrategy": {"enable": True},
                    "nodeStrategies": [
                        {"nodeSelector": {"matchLabels": {"pool": "b"}}, "memoryEvictThresholdPercent": 50},
                        {"nodeSelector": {"matchLabels": {"zone": "z"}}, "memoryEvictThresholdPercent": 60},
                    ],
                }
            )
        }
    )
    nodes = config.thresholds.nodes
    assert watermarks.strategy_index(nodes, {"pool": "b", "zone": "z"}) == 1
    assert watermarks.strategy_index(nodes, {"zone": "z"}) == 2
    assert watermarks.strategy_index(nodes, {}) == 0
    strategies = config.strategies()
    assert [s["memoryEvictThresholdPercent"] for s in strategies] == [70, 50, 60]  # the default 70 merged in


def test_eviction_caps_follow_who_node_qos_evicts() -> None:
    assert watermarks.eviction_caps(QOS_ON, BE) == {"memory": 69}  # BEMemoryEvict
    assert watermarks.eviction_caps(QOS_ON, LS) == {}
    assert watermarks.eviction_caps(QOS_ON, ENABLED_LOW) == {}  # no evictEnabledPriorityThreshold: nobody else
    with_priority = {**QOS_ON, "evictEnabledPriorityThreshold": 5999}
    assert watermarks.eviction_caps(with_priority, ENABLED_LOW) == {"memory": 69, "cpu": 79}
    high = EvictionFacts(best_effort=False, eviction_enabled=True, priority=7000)
    assert watermarks.eviction_caps(with_priority, high) == {}  # above the priority threshold
    assert watermarks.eviction_caps({**QOS_ON, "enable": False}, BE) == {}


def test_capped_lowers_and_fills_thresholds() -> None:
    assert watermarks.capped({"cpu": 65, "memory": 95}, {"memory": 69}) == {"cpu": 65, "memory": 69}
    assert watermarks.capped({"cpu": 65, "memory": 50}, {"memory": 69}) == {"cpu": 65, "memory": 50}
    assert watermarks.capped({"cpu": 65}, {"memory": 69}) == {"cpu": 65, "memory": 69}  # unchecked → the cap


def _state(data: dict[str, str]) -> LoadState:
    config = watermarks.read_watermarks(data)
    load = LoadState(apply_watermarks(DEFAULT_ARGS, config.watermarks), config)
    load.apply_node("n", node("n", cpu="32", memory="100Gi"))
    load.apply_metric(report("n", at=NOW - 10, cpu=8000, memory=75 * GI))
    return load


QOS = {"resource-threshold-config": json.dumps({"clusterStrategy": {"enable": True}})}  # BE memory evict at 70%


def test_a_be_pod_is_not_placed_where_node_qos_would_evict_it() -> None:
    """The evict → reschedule loop of user-asks #8: memory 75% + the pod is under the scheduler's 95% but at or over
    BE eviction's 70%."""
    load = _state(QOS)
    be_pod = core.incoming(pod("be", memory="1Gi", labels={"koordinator.sh/qosClass": "BE"}), load.args)
    ls_pod = core.incoming(pod("ls", memory="1Gi", labels={"koordinator.sh/qosClass": "LS"}), load.args)
    verdict = core.filter_node(load, be_pod, "n", now=NOW, explain=True)
    assert not verdict.passed and verdict.reason == "node(s) memory usage exceed threshold"
    assert "> 69 (capped: node QoS evicts this pod at 70%)" in verdict.detail
    assert core.filter_node(load, ls_pod, "n", now=NOW).passed
    off = _state({**QOS, "load-watermarks-config": '{"avoidEvictionLoops": false}'})
    assert core.filter_node(off, be_pod, "n", now=NOW).passed
    no_qos = _state({})
    assert core.filter_node(no_qos, be_pod, "n", now=NOW).passed


def test_the_key_sets_the_extender_and_the_descheduler_alike() -> None:
    marks = parse_watermarks(
        '{"usageThresholds": {"cpu": 55, "memory": 0}, "lowThresholds": {"cpu": 20}, "nodeMetricExpirationSeconds": 90}'
    )
    args = apply_watermarks(DEFAULT_ARGS, marks)
    assert args.usage_thresholds == {"cpu": 55, "memory": 0}
    assert args.node_metric_expiration_seconds == 90
    assert args.estimated_scaling_factors == DEFAULT_ARGS.estimated_scaling_factors  # untouched
    deschedule = apply_deschedule_watermarks(LowNodeLoadArgs(enabled=True), marks)
    assert deschedule.high_thresholds == {"cpu": 55.0}  # 0: the scheduler does not check memory → never overloaded
    assert deschedule.low_thresholds == {"cpu": 20.0}
    assert deschedule.stale_after_seconds == 90.0 and deschedule.enabled
    assert apply_watermarks(DEFAULT_ARGS, watermarks.ABSENT) is DEFAULT_ARGS


def test_findings_name_each_loop() -> None:
    strategies = [("cluster", QOS_ON), ("nodeStrategies[0] b", {"enable": False, "memoryEvictThresholdPercent": 10})]
    found = watermarks.findings(
        schedule={"cpu": 65, "memory": 95},
        deschedule_high={"cpu": 70.0, "memory": 80.0},
        scheduler_stale_seconds=180,
        descheduler_stale_seconds=120,
        strategies=strategies,
        avoid_eviction_loops=False,
    )
    codes = [(f.severity, f.code) for f in found]
    assert codes == [
        ("warning", "deschedule-reschedule-loop"),  # memory 95 > 80; cpu 65 ≤ 70 is fine
        ("warning", "staleness-mismatch"),
        ("warning", "evict-reschedule-loop"),  # memory 95 ≥ 70; cpu evict needs evictEnabledPriorityThreshold
    ]
    assert "memory: the scheduler places pods up to 95% but the descheduler drains nodes above 80%" in found[0].message
    capped = watermarks.findings(
        schedule={"cpu": 65, "memory": 95},
        deschedule_high=None,
        scheduler_stale_seconds=180,
        descheduler_stale_seconds=None,
        strategies=strategies,
        avoid_eviction_loops=True,
    )
    assert [(f.severity, f.code) for f in capped] == [("info", "eviction-cap")]
    assert "caps them at 69%" in capped[0].message


def test_the_view_puts_the_three_side_by_side() -> None:
    data = {
        "load-watermarks-config": '{"usageThresholds": {"cpu": 60, "memory": 90}, "avoidEvictionLoops": false}',
        "resource-threshold-config": json.dumps(
            {"clusterStrategy": {"enable": True, "memoryEvictThresholdPercent": 65}}
        ),
    }
    stated = {
        "descheduler": WatermarksInEffect(
            service="descheduler",
            at=NOW,
            usage_thresholds={"cpu": 60.0, "memory": 90.0},
            low_thresholds={"cpu": 30.0, "memory": 40.0},
            stale_after_seconds=180,
            from_configmap=["usageThresholds"],
        )
    }
    view = build_view(
        configmap={"found": True}, data=data, stated=stated, defaults=watermark_defaults(), dashboard_stale_seconds=180
    )
    memory = next(row for row in view.resources if row["resource"] == "memory")
    assert memory["schedule"] == 90 and memory["descheduleHigh"] == 90 and memory["descheduleLow"] == 40
    assert memory["nodeQoS"] == [{"strategy": "cluster", "suppress": None, "evict": 65, "capForBEPods": None}]
    assert view.scheduler["reported"] is False and view.scheduler["fromConfigMap"] == [
        "usageThresholds"
    ]  # the loadaware service is not running: defaults with the key applied
    assert view.descheduler["reported"] is True
    codes = [f["code"] for f in view.findings]
    assert "evict-reschedule-loop" in codes and "not-reported" in codes
    assert "deschedule-reschedule-loop" not in codes  # one line for both
    assert view.configMap["load-watermarks-config"]["usageThresholds"] == {"cpu": 60, "memory": 90}


def test_the_cli_prints_the_view_as_a_table_with_its_findings() -> None:
    data = {"resource-threshold-config": json.dumps({"clusterStrategy": {"enable": True}})}
    view = build_view(
        configmap={"found": True}, data=data, stated={}, defaults=watermark_defaults(), dashboard_stale_seconds=180
    ).model_dump()
    text = render_watermarks(view)
    lines = text.splitlines()
    assert lines[0].split() == ["RESOURCE", "SCHEDULE", "PROD", "DRAIN", "ABOVE", "FILL", "BELOW", "NODE", "QOS"]
    assert lines[1].split()[:3] == ["cpu", "65%", "-"]
    assert "cluster: suppress 65%" in lines[1]
    assert "cluster: evict 70%, BE pods capped at 69%" in lines[2]
    assert "stale NodeMetric: scheduler 180 s (filters the node), descheduler 180 s" in text
    assert "INFO eviction-cap: cluster: node QoS evicts BE pods at memory 70%; the scheduler would admit" in text
    assert "INFO no-shared-watermarks" in text
    assert "descheduler: not reported, load-aware descheduling off; from the ConfigMap: nothing" in text
