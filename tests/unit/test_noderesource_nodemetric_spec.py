"""services.noderesource.state: each decision carries the node's NodeMetric spec (spec §1.3), or None while the
ConfigMap is in error status, and a changed spec makes a decision worth publishing."""

from __future__ import annotations

import msgspec

from schemas.node import MetricCollectPolicy
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from services.noderesource.state import is_repeat, last_write_after
from tests.unit.test_noderesource_state import T0, config_event, decide, node_event, worked_example

BIG_POOL = {
    "enable": True,
    "metricAggregateDurationSeconds": 600,
    "nodeConfigs": [
        {
            "name": "big",
            "nodeSelector": {"matchLabels": {"pool": "big"}},
            "metricAggregateDurationSeconds": 120,
            "metricReportIntervalSeconds": 30,
            "metricAggregatePolicy": {"durations": ["2m", "1h"]},
            "metricMemoryCollectPolicy": "usageWithPageCache",
        }
    ],
}


def test_an_enabled_node_gets_its_merged_strategy_as_spec() -> None:
    state = worked_example()
    state.apply(config_event(BIG_POOL, rv="2"))
    assert decide(state).nodemetric_spec == MetricCollectPolicy(aggregate_duration_seconds=600)  # cluster strategy
    state.apply(node_event(rv="2", labels={"pool": "big"}))
    assert decide(state).nodemetric_spec == MetricCollectPolicy(
        aggregate_duration_seconds=120,
        report_interval_seconds=30,
        durations_seconds=(120, 3600),
        node_memory_collect_policy="usageWithPageCache",
    )


def test_a_disabled_node_gets_the_default_spec() -> None:
    state = worked_example()
    state.apply(config_event({"enable": False, "metricAggregateDurationSeconds": 600}, rv="2"))
    decision = decide(state)
    assert decision.outcome == "disabled"
    assert decision.nodemetric_spec == MetricCollectPolicy()


def test_a_node_enabled_only_by_its_node_config_while_the_cluster_is_disabled_gets_the_default_spec() -> None:
    state = worked_example()
    config = {**BIG_POOL, "enable": False}
    config["nodeConfigs"] = [{**BIG_POOL["nodeConfigs"][0], "enable": True}]  # type: ignore[index]
    state.apply(config_event(config, rv="2"))
    state.apply(node_event(rv="2", labels={"pool": "big"}))
    assert decide(state).nodemetric_spec == MetricCollectPolicy()


def test_the_config_error_status_leaves_the_spec_out() -> None:
    state = worked_example()
    state.apply(config_event(BIG_POOL, rv="2"))
    assert decide(state).nodemetric_spec is not None
    state.apply(config_event({"enable": True, "metricReportIntervalSeconds": 0}, rv="3"))
    assert state.config.error is not None
    assert decide(state).nodemetric_spec is None
    state.apply(config_event(BIG_POOL, rv="4"))  # fixed again
    assert decide(state).nodemetric_spec == MetricCollectPolicy(aggregate_duration_seconds=600)


def test_a_decision_whose_spec_changed_is_not_a_repeat() -> None:
    state = worked_example()
    first = decide(state)
    state.apply(config_event({"enable": True, "metricReportIntervalSeconds": 30}, rv="2"))
    second = decide(state, now=T0 + 10, last=last_write_after(first))
    assert not second.write_due and second.resources == first.resources
    assert second.nodemetric_spec != first.nodemetric_spec
    assert not is_repeat(first, second)
    third = decide(state, now=T0 + 20, last=last_write_after(second))
    assert is_repeat(second, third)


def test_decisions_without_the_field_still_decode() -> None:
    decision = decide(worked_example())
    old = msgspec.json.decode(msgspec.json.encode(decision))
    del old["nodemetric_spec"]
    decoded = NODERESOURCE_COMPUTED_DECODER.decode(msgspec.json.encode(old))
    assert isinstance(decoded, NodeResourceComputed)
    assert decoded.nodemetric_spec is None
    assert NODERESOURCE_COMPUTED_DECODER.decode(msgspec.json.encode(decision)) == decision
