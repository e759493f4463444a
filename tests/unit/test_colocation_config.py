"""colocation-config (services.noderesource.config): defaults, validation, merging, selectors, per-node strategy,
the ConfigMap load state machine, and the real ConfigMaps from ../shared."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from schemas import koordinator, node
from services.noderesource import config
from services.noderesource.strategy import ColocationStrategy

CRDS = Path(__file__).parents[2].parent / "shared" / "reference" / "koordinator-crds"
CPU_RATIO, MEMORY_RATIO = "node.koordinator.sh/cpu-reclaim-ratio", "node.koordinator.sh/memory-reclaim-ratio"
MID_CPU_RATIO = "node.koordinator.sh/mid-static-cpu-reserved-ratio"
MID_MEMORY_RATIO = "node.koordinator.sh/mid-static-memory-reserved-ratio"


def parse(obj: Any) -> config.ClusterColocationConfig:
    return config.parse_colocation_config(json.dumps(obj))


def cluster(obj: Any) -> ColocationStrategy:
    return parse(obj).strategy


def entry(selector: Any = None, **fields: Any) -> dict[str, Any]:
    """A nodeConfigs entry; `selector` None gives an empty selector (every node)."""
    return {"nodeSelector": {} if selector is None else selector, **fields}


# --- defaults


DEFAULTS = [
    ("enable", False),
    ("metric_aggregate_duration_seconds", 300),
    ("metric_report_interval_seconds", 60),
    ("metric_aggregate_durations_seconds", (300, 600, 1800)),
    ("metric_memory_collect_policy", "usageWithoutPageCache"),
    ("cpu_reclaim_threshold_percent", 60),
    ("cpu_calculate_policy", "usage"),
    ("memory_reclaim_threshold_percent", 65),
    ("memory_calculate_policy", "usage"),
    ("degrade_time_minutes", 15),
    ("update_time_threshold_seconds", 300),
    ("resource_diff_threshold", 0.1),
    ("batch_cpu_threshold_percent", None),
    ("batch_memory_threshold_percent", None),
    ("mid_reclaim_mode", None),
    ("mid_cpu_threshold_percent", 100),
    ("mid_memory_threshold_percent", 100),
    ("mid_unallocated_percent", 0),
    ("mid_static_cpu_reserved_percent", 0),
    ("mid_static_memory_reserved_percent", 0),
    ("extensions", {}),
]


@pytest.mark.parametrize("text", [None, "", "{}", "null", '{"nodeConfigs": null}', '{"nodeConfigs": []}'])
@pytest.mark.parametrize(("field", "value"), DEFAULTS)
def test_defaults(text: str | None, field: str, value: object) -> None:
    parsed = config.parse_colocation_config(text)
    assert getattr(parsed.strategy, field) == value
    assert parsed.node_configs == ()


def test_defaults_in_koordinator_json() -> None:
    assert config.strategy_to_json(ColocationStrategy()) == {
        "enable": False,
        "metricAggregateDurationSeconds": 300,
        "metricReportIntervalSeconds": 60,
        "metricAggregatePolicy": {"durations": ["5m0s", "10m0s", "30m0s"]},
        "metricMemoryCollectPolicy": "usageWithoutPageCache",
        "cpuReclaimThresholdPercent": 60,
        "cpuCalculatePolicy": "usage",
        "memoryReclaimThresholdPercent": 65,
        "memoryCalculatePolicy": "usage",
        "degradeTimeMinutes": 15,
        "updateTimeThresholdSeconds": 300,
        "resourceDiffThreshold": 0.1,
        "midCPUThresholdPercent": 100,
        "midMemoryThresholdPercent": 100,
        "midUnallocatedPercent": 0,
        "midStaticCPUReservedPercent": 0,
        "midStaticMemoryReservedPercent": 0,
    }


# --- validation (§2.2 table)


INVALID = [
    ("metricAggregateDurationSeconds", 0, "must be > 0"),
    ("metricAggregateDurationSeconds", -300, "must be > 0"),
    ("metricReportIntervalSeconds", 0, "must be > 0"),
    ("metricMemoryCollectPolicy", "", "must be one of"),
    ("metricMemoryCollectPolicy", "usage", "must be one of"),
    ("cpuReclaimThresholdPercent", -1, "must be ≥ 0"),
    ("cpuCalculatePolicy", "", "must be one of"),
    ("cpuCalculatePolicy", "Usage", "must be one of"),
    ("memoryReclaimThresholdPercent", -1, "must be ≥ 0"),
    ("memoryCalculatePolicy", "requests", "must be one of"),
    ("degradeTimeMinutes", 0, "must be > 0"),
    ("updateTimeThresholdSeconds", 0, "must be > 0"),
    ("resourceDiffThreshold", 0, "must be > 0"),
    ("resourceDiffThreshold", -0.5, "must be > 0"),
    ("batchCPUThresholdPercent", -1, "must be ≥ 0"),
    ("batchMemoryThresholdPercent", -1, "must be ≥ 0"),
    ("midReclaimMode", "dynamic", "must be one of static"),
    ("midReclaimMode", "", "must be one of static"),
    ("midCPUThresholdPercent", -1, "must be between 0 and 100"),
    ("midCPUThresholdPercent", 101, "must be between 0 and 100"),
    ("midMemoryThresholdPercent", 101, "must be between 0 and 100"),
    ("midUnallocatedPercent", -1, "must be between 0 and 100"),
    ("midUnallocatedPercent", 101, "must be between 0 and 100"),
    ("midStaticCPUReservedPercent", -1, "must be ≥ 0"),
    ("midStaticMemoryReservedPercent", -1, "must be ≥ 0"),
]


@pytest.mark.parametrize(("field", "value", "reason"), INVALID)
def test_invalid_cluster_value_names_field_and_value(field: str, value: object, reason: str) -> None:
    with pytest.raises(config.ColocationConfigError) as caught:
        parse({"enable": True, field: value})
    ((path, message),) = caught.value.problems
    stored = float(value) if field == "resourceDiffThreshold" else value  # type: ignore[arg-type]
    assert path == f"$.{field}" and message.startswith(reason) and message.endswith(f"got {stored!r}")
    assert not caught.value.malformed  # it decodes; Koordinator's validation rejects it
    assert str(caught.value) == f"{path}: {message}"


VALID_EDGES = [
    ("metricAggregateDurationSeconds", 1, "metric_aggregate_duration_seconds"),
    ("metricMemoryCollectPolicy", "usageWithHotPageCache", "metric_memory_collect_policy"),
    ("metricMemoryCollectPolicy", "usageWithPageCache", "metric_memory_collect_policy"),
    ("cpuReclaimThresholdPercent", 0, "cpu_reclaim_threshold_percent"),
    ("cpuReclaimThresholdPercent", 150, "cpu_reclaim_threshold_percent"),
    ("cpuCalculatePolicy", "maxUsageRequest", "cpu_calculate_policy"),
    ("cpuCalculatePolicy", "request", "cpu_calculate_policy"),  # kept; the calculator treats it as usage
    ("memoryCalculatePolicy", "request", "memory_calculate_policy"),
    ("memoryCalculatePolicy", "maxUsageRequest", "memory_calculate_policy"),
    ("resourceDiffThreshold", 2.5, "resource_diff_threshold"),  # only the webhook caps it at 1
    ("batchCPUThresholdPercent", 0, "batch_cpu_threshold_percent"),
    ("batchMemoryThresholdPercent", 250, "batch_memory_threshold_percent"),
    ("midReclaimMode", "static", "mid_reclaim_mode"),
    ("midCPUThresholdPercent", 0, "mid_cpu_threshold_percent"),
    ("midMemoryThresholdPercent", 100, "mid_memory_threshold_percent"),
    ("midUnallocatedPercent", 100, "mid_unallocated_percent"),
    ("midStaticCPUReservedPercent", 300, "mid_static_cpu_reserved_percent"),
]


@pytest.mark.parametrize(("field", "value", "attribute"), VALID_EDGES)
def test_valid_edge_values(field: str, value: object, attribute: str) -> None:
    assert getattr(cluster({field: value}), attribute) == value


@pytest.mark.parametrize(
    ("durations", "problem"),
    [(["0s"], "'0s'"), (["5m", "-5m"], "durations[1]: must be a positive whole number of seconds, got '-5m'"),
     (["1.5s"], "'1.5s'")],
)  # fmt: skip
def test_durations_must_be_positive_whole_seconds(durations: list[str], problem: str) -> None:
    with pytest.raises(config.ColocationConfigError, match=r"\$\.metricAggregatePolicy\.durations\[\d\]") as caught:
        parse({"metricAggregatePolicy": {"durations": durations}})
    assert problem in str(caught.value)


def test_every_problem_reported_in_field_order() -> None:
    with pytest.raises(config.ColocationConfigError) as caught:
        parse({"midUnallocatedPercent": 101, "cpuReclaimThresholdPercent": -1, "degradeTimeMinutes": 0})
    paths = [path for path, _ in caught.value.problems]
    assert paths == ["$.cpuReclaimThresholdPercent", "$.degradeTimeMinutes", "$.midUnallocatedPercent"]


# --- decoding: types, unknown fields, key case, null


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"enable": "true"}', "$.enable: expected bool | null, got str 'true'"),
        ('{"enable": 1}', "$.enable: expected bool | null, got int 1"),
        ('{"cpuReclaimThresholdPercent": 60.5}', "$.cpuReclaimThresholdPercent: expected int | null, got float 60.5"),
        ('{"cpuReclaimThresholdPercent": "60"}', "$.cpuReclaimThresholdPercent: expected int | null, got str '60'"),
        ('{"cpuReclaimThresholdPercent": 9223372036854775808}', "$.cpuReclaimThresholdPercent: expected int <="),
        ('{"metricAggregatePolicy": {"durations": "5m"}}', "$.metricAggregatePolicy.durations: expected array"),
        ('{"metricAggregatePolicy": {"durations": [300]}}', "$.metricAggregatePolicy.durations[0]: expected str"),
        (
            '{"metricAggregatePolicy": {"durations": ["5 min"]}}',
            "$.metricAggregatePolicy.durations[0]: invalid duration '5 min'",
        ),
        ('{"extensions": []}', "$.extensions: expected object | null, got array []"),
        ('{"nodeConfigs": {}}', "$.nodeConfigs: expected array | null, got object {}"),
        ('{"nodeConfigs": [{"degradeTimeMinutes": "x"}]}', "$.nodeConfigs[0].degradeTimeMinutes: expected int"),
        ('{"nodeConfigs": [{"metricAggregatePolicy": {"durations": ["x"]}}]}', "$.nodeConfigs[0].metricAggre"),
        ('{"nodeConfigs": [{"nodeSelector": {"matchLabels": {"a": 1}}}]}', "$.nodeConfigs[0].nodeSelector.matchL"),
        (
            '{"nodeConfigs": [{"nodeSelector": {"matchExpressions": [{"key": 5}]}}]}',
            "$.nodeConfigs[0].nodeSelector.matchExpressions[0].key: expected str",
        ),
        ("[]", "$: expected a JSON object, got list []"),
        ('"enable"', "$: expected a JSON object, got str 'enable'"),
        ('{"enable": true,}', "$: not JSON: JSON is malformed"),
        (" ", "$: not JSON"),  # only exactly "" means "use the defaults", as in Koordinator
    ],
)
def test_wrong_types_fail_the_whole_document(text: str, message: str) -> None:
    with pytest.raises(config.ColocationConfigError) as caught:
        config.parse_colocation_config(text)
    assert message in str(caught.value) and caught.value.malformed


def test_unknown_fields_are_ignored() -> None:
    parsed = parse(
        {
            "enable": True,
            "someFutureKnob": {"x": 1},
            "metricAggregatePolicy": {"durations": ["1m"], "statisticTypes": ["avg"]},
            "nodeConfigs": [entry(name="a", nodeSelector={"matchLabels": {"k": "v"}, "other": 1}, bogus=[1])],
        }
    )
    assert parsed.strategy.enable and parsed.strategy.metric_aggregate_durations_seconds == (60,)
    assert parsed.node_configs[0].strategy == parsed.strategy and parsed.node_configs[0].warnings == ()


def test_keys_match_field_names_case_insensitively_last_wins() -> None:
    text = (
        '{"ENABLE": false, "enable": true,'
        ' "batchCpuThresholdPercent": 40, "MetricAggregatePolicy": {"Durations": ["2m"]}}'
    )
    strategy = config.parse_colocation_config(text).strategy
    assert strategy.enable and strategy.batch_cpu_threshold_percent == 40
    assert strategy.metric_aggregate_durations_seconds == (120,)
    assert cluster({"enable": True, "Enable": False}).enable is False


def test_null_means_absent() -> None:
    assert cluster({"cpuReclaimThresholdPercent": None, "metricAggregatePolicy": None}) == ColocationStrategy()
    parsed = parse({"cpuReclaimThresholdPercent": 70, "nodeConfigs": [entry(cpuReclaimThresholdPercent=None)]})
    assert parsed.node_configs[0].strategy.cpu_reclaim_threshold_percent == 70


# --- merging


def test_node_config_fields_win_even_when_falsy() -> None:
    parsed = parse(
        {
            "enable": True,
            "cpuReclaimThresholdPercent": 70,
            "nodeConfigs": [entry(enable=False, cpuReclaimThresholdPercent=0)],
        }
    )
    merged = parsed.node_configs[0].strategy
    assert (merged.enable, merged.cpu_reclaim_threshold_percent) == (False, 0)
    assert merged.memory_reclaim_threshold_percent == 65  # absent: the cluster's (here the default)


@pytest.mark.parametrize(
    ("policy", "expected"),
    [({}, (60, 120)), ({"durations": []}, (60, 120)), ({"durations": ["15m"]}, (900,))],
    ids=["empty-object-merges", "empty-list-is-dropped-like-go-omitempty", "list-replaces"],
)
def test_nested_policy_merges_and_lists_replace(policy: dict[str, Any], expected: tuple[int, ...]) -> None:
    parsed = parse(
        {"metricAggregatePolicy": {"durations": ["1m", "2m"]}, "nodeConfigs": [entry(metricAggregatePolicy=policy)]}
    )
    assert parsed.node_configs[0].strategy.metric_aggregate_durations_seconds == expected


def test_extensions_merge_by_top_level_key() -> None:
    parsed = parse(
        {
            "extensions": {"a": 1, "b": {"x": 1}},
            "nodeConfigs": [entry(extensions={"b": {"y": 2}, "c": None}), entry(extensions={})],
        }
    )
    assert parsed.strategy.extensions == {"a": 1, "b": {"x": 1}}
    assert parsed.node_configs[0].strategy.extensions == {"a": 1, "b": {"y": 2}, "c": None}
    assert parsed.node_configs[1].strategy.extensions == {"a": 1, "b": {"x": 1}}


def test_invalid_node_config_falls_back_to_cluster_strategy() -> None:
    parsed = parse(
        {
            "enable": True,
            "cpuReclaimThresholdPercent": 70,
            "nodeConfigs": [
                entry(name="bad", cpuReclaimThresholdPercent=80, midCPUThresholdPercent=150),
                entry(name="good", cpuReclaimThresholdPercent=80),
            ],
        }
    )
    bad, good = parsed.node_configs
    assert bad.strategy == parsed.strategy and bad.name == "bad"
    (warning,) = bad.warnings
    assert "cluster strategy applies" in warning
    assert "$.nodeConfigs[0].midCPUThresholdPercent: must be between 0 and 100, got 150" in warning
    assert good.strategy.cpu_reclaim_threshold_percent == 80 and good.warnings == ()


def test_invalid_node_config_durations_fall_back() -> None:
    parsed = parse({"nodeConfigs": [entry(metricAggregatePolicy={"durations": ["500ms"]})]})
    assert parsed.node_configs[0].strategy == parsed.strategy
    assert "$.nodeConfigs[0].metricAggregatePolicy.durations[0]" in parsed.node_configs[0].warnings[0]


OVERRIDE_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "enable": st.booleans(),
    "metricAggregateDurationSeconds": st.integers(1, 10**6),
    "metricReportIntervalSeconds": st.integers(1, 10**6),
    "metricAggregatePolicy": st.lists(st.integers(1, 3 * 86400), min_size=1, max_size=4).map(
        lambda seconds: {"durations": [koordinator.format_go_duration(s) for s in seconds]}
    ),
    "metricMemoryCollectPolicy": st.sampled_from(
        ["usageWithoutPageCache", "usageWithHotPageCache", "usageWithPageCache"]
    ),
    "cpuReclaimThresholdPercent": st.integers(0, 300),
    "cpuCalculatePolicy": st.sampled_from(["usage", "request", "maxUsageRequest"]),
    "memoryReclaimThresholdPercent": st.integers(0, 300),
    "memoryCalculatePolicy": st.sampled_from(["usage", "request", "maxUsageRequest"]),
    "degradeTimeMinutes": st.integers(1, 10**4),
    "updateTimeThresholdSeconds": st.integers(1, 10**6),
    "resourceDiffThreshold": st.floats(min_value=1e-6, max_value=100.0),
    "batchCPUThresholdPercent": st.integers(0, 300),
    "batchMemoryThresholdPercent": st.integers(0, 300),
    "midReclaimMode": st.just("static"),
    "midCPUThresholdPercent": st.integers(0, 100),
    "midMemoryThresholdPercent": st.integers(0, 100),
    "midUnallocatedPercent": st.integers(0, 100),
    "midStaticCPUReservedPercent": st.integers(0, 300),
    "midStaticMemoryReservedPercent": st.integers(0, 300),
    "extensions": st.dictionaries(st.sampled_from("abcd"), st.integers() | st.none(), max_size=3),
}
ATTRIBUTE = {
    "metricAggregatePolicy": "metric_aggregate_durations_seconds",
    "batchCPUThresholdPercent": "batch_cpu_threshold_percent",
    "midCPUThresholdPercent": "mid_cpu_threshold_percent",
    "midStaticCPUReservedPercent": "mid_static_cpu_reserved_percent",
}
partial_overrides = st.fixed_dictionaries({}, optional=OVERRIDE_VALUES)


def overlay(base: ColocationStrategy, fields: dict[str, Any]) -> ColocationStrategy:
    """The merge written out field by field, independently of the module."""
    changes: dict[str, Any] = {}
    for key, value in fields.items():
        name = ATTRIBUTE.get(key) or "".join("_" + c.lower() if c.isupper() else c for c in key)
        if key == "metricAggregatePolicy":
            value = tuple(int(koordinator.parse_go_duration(d)) for d in value["durations"])
        elif key == "extensions":
            value = base.extensions | value
        changes[name] = value
    return msgspec.structs.replace(base, **changes)


@given(partial_overrides, partial_overrides)
def test_merge_of_random_partial_overrides(cluster_fields: dict[str, Any], node_fields: dict[str, Any]) -> None:
    parsed = parse({**cluster_fields, "nodeConfigs": [entry(**node_fields)]})
    assert parsed.strategy == overlay(ColocationStrategy(), cluster_fields)
    assert parsed.node_configs[0].strategy == overlay(parsed.strategy, node_fields)
    assert parsed.node_configs[0].warnings == ()


@given(partial_overrides)
def test_strategy_json_round_trips(fields: dict[str, Any]) -> None:
    strategy = cluster(fields)
    rendered = config.strategy_to_json(strategy)
    assert cluster(rendered) == strategy
    assert json.loads(json.dumps(rendered)) == rendered


@given(partial_overrides, partial_overrides)
def test_config_json_round_trips(cluster_fields: dict[str, Any], node_fields: dict[str, Any]) -> None:
    selector = {"matchLabels": {"pool": "a"}, "matchExpressions": [{"key": "zone", "operator": "Exists"}]}
    parsed = parse({**cluster_fields, "nodeConfigs": [entry(selector, name="pool-a", **node_fields)]})
    again = config.parse_colocation_object(json.loads(json.dumps(config.config_to_json(parsed))))
    assert again == parsed


# --- nodeSelector


SELECTOR_CASES = [
    ({}, {}, True),
    ({"matchLabels": {}}, {"a": "1"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "1", "b": "2"}, True),
    ({"matchLabels": {"a": "1"}}, {"a": "2"}, False),
    ({"matchLabels": {"a": ""}}, {}, False),
    ({"matchLabels": {"a": ""}}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1", "2"]}]}, {"a": "3"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]}, {}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {"a": "2"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}, {}, True),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"a": ""}, True),
    ({"matchExpressions": [{"key": "a", "operator": "Exists"}]}, {"b": "1"}, False),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]}, {"b": "1"}, True),
    ({"matchExpressions": [{"key": "a", "operator": "DoesNotExist", "values": []}]}, {"a": "1"}, False),
    (
        {"matchLabels": {"pool": "x"}, "matchExpressions": [{"key": "example.com/gpu", "operator": "Exists"}]},
        {"pool": "x"},
        False,
    ),
    (
        {"matchLabels": {"pool": "x"}, "matchExpressions": [{"key": "example.com/gpu", "operator": "Exists"}]},
        {"pool": "x", "example.com/gpu": "a100"},
        True,
    ),
]


@pytest.mark.parametrize(("selector", "labels", "matches"), SELECTOR_CASES)
def test_selector_operators(selector: dict[str, Any], labels: dict[str, str], matches: bool) -> None:
    parsed = msgspec.convert(selector, config.LabelSelector)
    assert config.selector_problems(parsed) == []
    assert config.selector_matches(parsed, labels) is matches


@pytest.mark.parametrize(
    ("selector", "problem"),
    [
        ({"matchExpressions": [{"key": "a", "operator": "Equals", "values": ["1"]}]}, "operator 'Equals'"),
        ({"matchExpressions": [{"key": "a", "operator": "in", "values": ["1"]}]}, "operator 'in'"),
        ({"matchExpressions": [{"key": "a", "operator": "In"}]}, "In needs values"),
        ({"matchExpressions": [{"key": "a", "operator": "NotIn", "values": []}]}, "NotIn needs values"),
        ({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["1"]}]}, "Exists takes no values"),
        ({"matchExpressions": [{"operator": "Exists"}]}, "invalid label key ''"),
        ({"matchExpressions": [{"key": "a/b/c", "operator": "Exists"}]}, "invalid label key"),
        ({"matchExpressions": [{"key": "a", "operator": "In", "values": ["-x"]}]}, "invalid label value '-x'"),
        ({"matchLabels": {"Example.com/a": "1"}}, "invalid label"),
        ({"matchLabels": {"a": "x" * 64}}, "invalid label"),
        ({"matchLabels": {"/a": "1"}}, "invalid label"),
    ],
)
def test_invalid_selector_matches_nothing_and_warns(selector: dict[str, Any], problem: str) -> None:
    parsed = parse({"enable": True, "nodeConfigs": [entry(selector, name="x", cpuReclaimThresholdPercent=90)]})
    (warning,) = parsed.node_configs[0].warnings
    assert warning.startswith("$.nodeConfigs[0].nodeSelector: ") and problem in warning
    result = config.node_strategy(parsed, {"a": "1", "b": "2"}, {})
    assert result.node_config_index is None and result.strategy == parsed.strategy


def test_absent_selector_matches_no_node() -> None:
    parsed = parse({"nodeConfigs": [{"name": "nothing", "cpuReclaimThresholdPercent": 90}]})
    assert parsed.node_configs[0].warnings == ("$.nodeConfigs[0].nodeSelector: absent, so the entry matches no node",)
    assert config.node_strategy(parsed, {}, {}).node_config_index is None


# --- node strategy: nodeConfigs, annotation, labels


POOLS = {
    "enable": True,
    "cpuReclaimThresholdPercent": 60,
    "nodeConfigs": [
        entry({"matchLabels": {"pool": "gpu"}}, name="gpu", cpuReclaimThresholdPercent=50),
        entry(
            {"matchExpressions": [{"key": "pool", "operator": "Exists"}]},
            name="any-pool",
            cpuReclaimThresholdPercent=70,
        ),
        entry({"matchLabels": {"pool": "batch"}}, name="batch-never-reached", cpuReclaimThresholdPercent=90),
    ],
}


@pytest.mark.parametrize(
    ("labels", "index", "name", "percent"),
    [({"pool": "gpu"}, 0, "gpu", 50), ({"pool": "batch"}, 1, "any-pool", 70), ({"zone": "a"}, None, None, 60)],
)
def test_first_matching_node_config_wins(
    labels: dict[str, str], index: int | None, name: str | None, percent: int
) -> None:
    result = config.node_strategy(parse(POOLS), labels, {})
    assert (result.node_config_index, result.node_config_name) == (index, name)
    assert result.strategy.cpu_reclaim_threshold_percent == percent and result.warnings == ()


def annotation(**fields: Any) -> dict[str, str]:
    return {config.ANNOTATION_NODE_STRATEGY: json.dumps(fields)}


def test_annotation_merges_over_node_config() -> None:
    result = config.node_strategy(
        parse(POOLS),
        {"pool": "gpu"},
        annotation(cpuReclaimThresholdPercent=40, metricAggregatePolicy={"durations": ["1m"]}, unknown=1),
    )
    assert result.strategy.cpu_reclaim_threshold_percent == 40 and result.node_config_name == "gpu"
    assert result.strategy.metric_aggregate_durations_seconds == (60,)
    assert result.warnings == ()


@pytest.mark.parametrize(
    ("text", "warning"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"cpuReclaimThresholdPercent": "40"}', "$.cpuReclaimThresholdPercent: expected int | null, got str '40'"),
        ('{"metricAggregatePolicy": {"durations": ["soon"]}}', "invalid duration 'soon'"),
        ('{"cpuReclaimThresholdPercent": 40, "degradeTimeMinutes": 0}', "$.degradeTimeMinutes: must be > 0, got 0"),
    ],
)
def test_bad_annotation_is_ignored_with_a_warning(text: str, warning: str) -> None:
    parsed = parse(POOLS)
    result = config.node_strategy(parsed, {"pool": "gpu"}, {config.ANNOTATION_NODE_STRATEGY: text})
    assert result.strategy == parsed.node_configs[0].strategy
    (message,) = result.warnings
    assert message.startswith(f"annotation {config.ANNOTATION_NODE_STRATEGY} ignored: ") and warning in message


def test_null_annotation_changes_nothing() -> None:
    parsed = parse(POOLS)
    result = config.node_strategy(parsed, {}, {config.ANNOTATION_NODE_STRATEGY: "null"})
    assert result.strategy == parsed.strategy and result.warnings == ()


@pytest.mark.parametrize(
    ("label", "attribute"),
    [
        (CPU_RATIO, "cpu_reclaim_threshold_percent"),
        (MEMORY_RATIO, "memory_reclaim_threshold_percent"),
        (MID_CPU_RATIO, "mid_static_cpu_reserved_percent"),
        (MID_MEMORY_RATIO, "mid_static_memory_reserved_percent"),
    ],
)
@pytest.mark.parametrize(
    ("value", "percent"),
    [("0.7", 70), ("0.75", 75), ("0.12", 12), ("0", 0), ("-0", 0), ("1.5", 150), ("1e-1", 10), ("0.299", 29)],
)
def test_ratio_labels_override_percentages(label: str, attribute: str, value: str, percent: int) -> None:
    parsed = parse(POOLS)
    result = config.node_strategy(parsed, {"pool": "gpu", label: value}, annotation(**{_camel(attribute): 33}))
    assert getattr(result.strategy, attribute) == percent and result.warnings == ()


@pytest.mark.parametrize("label", [CPU_RATIO, MEMORY_RATIO, MID_CPU_RATIO, MID_MEMORY_RATIO])
@pytest.mark.parametrize(
    "value", ["-0.1", "-1", "abc", "", " 0.5", "0.5 ", "1_0", "nan", "inf", "-inf", "0.5%", "1e400"]
)
def test_negative_or_garbage_ratio_labels_are_ignored(label: str, value: str) -> None:
    parsed = parse(POOLS)
    result = config.node_strategy(parsed, {label: value}, {})
    assert result.strategy == parsed.strategy
    assert result.warnings == (f"label {label}={value!r} ignored: not a non-negative number",)


def _camel(attribute: str) -> str:
    head, *rest = attribute.split("_")
    name = head + "".join(part.capitalize() for part in rest)
    return name.replace("Cpu", "CPU")


def test_colocation_needs_cluster_and_node_enabled() -> None:
    node_config = entry({"matchLabels": {"pool": "a"}}, enable=True, metricReportIntervalSeconds=30)
    result = config.node_strategy(parse({"enable": False, "nodeConfigs": [node_config]}), {"pool": "a"}, {})
    assert result.strategy.enable and not result.cluster_enabled and not result.colocation_enabled
    assert config.metric_collect_policy(result.strategy).report_interval_seconds == 30  # NodeMetric: node-merged
    assert not config.effective_strategy_from_json({"enable": False}, {}, annotation(enable=True)).enable
    disabled_node = config.node_strategy(parse({"enable": True}), {}, annotation(enable=False))
    assert disabled_node.cluster_enabled and not disabled_node.colocation_enabled


def test_effective_strategy_from_json() -> None:
    assert config.effective_strategy_from_json(None, {}, {}) == ColocationStrategy()
    obj = json.loads(json.dumps(POOLS))
    strategy = config.effective_strategy_from_json(
        obj, {"pool": "gpu", MEMORY_RATIO: "0.8"}, annotation(degradeTimeMinutes=5)
    )
    assert strategy.enable
    assert (strategy.cpu_reclaim_threshold_percent, strategy.memory_reclaim_threshold_percent) == (50, 80)
    assert strategy.degrade_time_minutes == 5
    with pytest.raises(config.ColocationConfigError, match=r"\$\.memoryReclaimThresholdPercent: must be ≥ 0, got -5"):
        config.effective_strategy_from_json({"memoryReclaimThresholdPercent": -5}, {}, {})
    with pytest.raises(config.ColocationConfigError, match="expected a JSON object"):
        config.effective_strategy_from_json([], {}, {})  # type: ignore[arg-type]


def test_metric_collect_policy() -> None:
    custom = cluster(
        {
            "metricAggregateDurationSeconds": 120,
            "metricReportIntervalSeconds": 30,
            "metricAggregatePolicy": {"durations": ["1m", "1h"]},
            "metricMemoryCollectPolicy": "usageWithPageCache",
        }
    )
    assert config.metric_collect_policy(custom) == node.MetricCollectPolicy()  # disabled: the default spec
    enabled = msgspec.structs.replace(custom, enable=True)
    assert config.metric_collect_policy(enabled) == node.MetricCollectPolicy(
        aggregate_duration_seconds=120,
        report_interval_seconds=30,
        durations_seconds=(60, 3600),
        node_memory_collect_policy="usageWithPageCache",
    )


# --- the ConfigMap load state machine


GOOD = {config.COLOCATION_CONFIG_KEY: '{"enable": true, "cpuReclaimThresholdPercent": 70}'}
OTHER_GOOD = {config.COLOCATION_CONFIG_KEY: '{"enable": true, "cpuReclaimThresholdPercent": 75}'}
BAD_JSON = {config.COLOCATION_CONFIG_KEY: '{"enable": true'}
BAD_VALUE = {config.COLOCATION_CONFIG_KEY: '{"enable": true, "midUnallocatedPercent": 200}'}


def test_state_starts_unavailable() -> None:
    state = config.ColocationConfigState()
    assert (state.available, state.error, state.config) == (False, None, config.ClusterColocationConfig())


@pytest.mark.parametrize(
    "data", [None, {}, {config.COLOCATION_CONFIG_KEY: ""}, {"resource-threshold-config": "{}"}], ids=str
)
def test_missing_configmap_or_key_gives_defaults(data: dict[str, str] | None) -> None:
    first = config.ColocationConfigState().apply(data)
    assert (first.changed, first.available, first.error) == (True, True, None)  # became available
    assert first.config == config.ClusterColocationConfig()
    loaded = first.state.apply(GOOD).state.apply(data)
    assert loaded.changed and loaded.config == config.ClusterColocationConfig() and loaded.error is None


@pytest.mark.parametrize("bad", [BAD_JSON, BAD_VALUE], ids=["bad-json", "invalid-value"])
def test_error_keeps_last_good_config(bad: dict[str, str]) -> None:
    good = config.ColocationConfigState().apply(GOOD).state
    after = good.apply(bad)
    assert not after.changed and after.available
    assert after.config == good.config and after.config.strategy.cpu_reclaim_threshold_percent == 70
    assert after.error is not None and after.error.startswith("invalid colocation-config, keeping the previous")
    still = after.state.apply(bad)
    assert not still.changed and still.error == after.error
    recovered = after.state.apply(GOOD)
    assert not recovered.changed and recovered.error is None  # same content as the last good one
    moved_on = after.state.apply(OTHER_GOOD)
    assert moved_on.changed and moved_on.error is None and moved_on.config.strategy.cpu_reclaim_threshold_percent == 75


def test_error_before_any_load_stays_unavailable() -> None:
    failed = config.ColocationConfigState().apply(BAD_VALUE)
    assert not failed.changed and not failed.available
    assert failed.error is not None and "$.midUnallocatedPercent: must be between 0 and 100, got 200" in failed.error
    assert failed.config == config.ClusterColocationConfig()
    loaded = failed.state.apply(GOOD)
    assert loaded.changed and loaded.available and loaded.error is None


def test_change_detection() -> None:
    state = config.ColocationConfigState().apply(GOOD).state
    assert not state.apply(dict(GOOD)).changed
    assert not state.apply({**GOOD, "resource-threshold-config": "{}"}).changed  # other keys are not ours
    same_meaning = {config.COLOCATION_CONFIG_KEY: '{"cpuReclaimThresholdPercent": 70, "enable": true, "x": 1}'}
    assert not state.apply(same_meaning).changed
    assert state.apply(OTHER_GOOD).changed
    node_config = {config.COLOCATION_CONFIG_KEY: json.dumps({**json.loads(GOOD["colocation-config"]), **POOLS})}
    assert state.apply(node_config).changed


# --- the real ConfigMaps in ../shared


def configmap_data(name: str) -> dict[str, str]:
    data: dict[str, str] = yaml.safe_load((CRDS / name).read_text())["data"]
    return data


def test_sample_configmap() -> None:
    change = config.ColocationConfigState().apply(configmap_data("slo-controller-config.sample.yaml"))
    assert change.available and change.error is None
    assert change.config.strategy == ColocationStrategy(enable=True)


def test_e2e_configmap() -> None:
    change = config.ColocationConfigState().apply(configmap_data("slo-controller-config.e2e.yaml"))
    assert change.error is None
    expected = ColocationStrategy(
        enable=True,
        cpu_reclaim_threshold_percent=60,
        memory_reclaim_threshold_percent=65,
        memory_calculate_policy="usage",
    )
    assert change.config.strategy == expected
    assert config.metric_collect_policy(change.config.strategy) == node.MetricCollectPolicy()


def test_documented_example_with_node_configs() -> None:
    """The example in Koordinator's configuration package documentation."""
    text = """{
      "enable": false, "metricAggregateDurationSeconds": 300, "metricReportIntervalSeconds": 60,
      "metricAggregatePolicy": {"durations": ["5m", "10m", "15m"]},
      "metricMemoryCollectPolicy": "usageWithoutPageCache", "cpuReclaimThresholdPercent": 60,
      "memoryReclaimThresholdPercent": 65, "memoryCalculatePolicy": "usage", "degradeTimeMinutes": 15,
      "updateTimeThresholdSeconds": 300, "resourceDiffThreshold": 0.1,
      "nodeConfigs": [{"name": "alios", "nodeSelector": {"matchLabels": {"kubernetes.io/kernel": "alios"}},
                       "updateTimeThresholdSeconds": 360, "resourceDiffThreshold": 0.2}]
    }"""
    parsed = config.parse_colocation_config(text)
    assert parsed.strategy == ColocationStrategy(metric_aggregate_durations_seconds=(300, 600, 900))
    result = config.node_strategy(parsed, {"kubernetes.io/kernel": "alios"}, {})
    assert result.node_config_name == "alios" and not result.colocation_enabled
    assert (result.strategy.update_time_threshold_seconds, result.strategy.resource_diff_threshold) == (360, 0.2)
    rendered = config.config_to_json(parsed)
    assert rendered["metricAggregatePolicy"] == {"durations": ["5m0s", "10m0s", "15m0s"]}
    assert rendered["nodeConfigs"][0]["nodeSelector"] == {"matchLabels": {"kubernetes.io/kernel": "alios"}}
