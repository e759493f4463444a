"""`koordbus calc nodeslo` on the situations Koordinator's own tests check (pkg/slo-controller/nodeslo:
resource_strategy_test.go, nodeslo_controller_test.go, nodeslo_cm_event_handler_test.go), restated as calc inputs
and the NodeSLO spec Koordinator renders for them. The ConfigMap texts are what Go's json.Marshal writes for the
tests' structs (a SystemStrategy always carries `"totalNetworkBandwidth":"0"`). Run through koordbus.calc.calculate,
the whole command but the process."""

from __future__ import annotations

import json
from typing import Any

import pytest

from koordbus import calc

THRESHOLD_DEFAULT = {
    "enable": False,
    "cpuSuppressThresholdPercent": 65,
    "cpuSuppressPolicy": "cpuset",
    "memoryEvictThresholdPercent": 70,
    "cpuEvictPolicy": "evictByRealLimit",
}
BURST_DEFAULT = {
    "policy": "none",
    "cpuBurstPercent": 1000,
    "cfsQuotaBurstPercent": 300,
    "cfsQuotaBurstPeriodSeconds": -1,
    "sharePoolThresholdPercent": 50,
}
SYSTEM_DEFAULT = {"totalNetworkBandwidth": 0}
DEFAULT_SPEC = {
    "resourceUsedThresholdWithBE": THRESHOLD_DEFAULT,
    "resourceQOSStrategy": {},
    "cpuBurstStrategy": BURST_DEFAULT,
    "systemStrategy": SYSTEM_DEFAULT,
    "extensions": {},
}


def selector(key: str, value: str) -> dict[str, Any]:
    return {"nodeSelector": {"matchLabels": {key: value}}}


def node(labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {"metadata": {"name": "test-node", "labels": labels or {}, "annotations": annotations or {}}}


def render(
    config_map: dict[str, Any] | None, the_node: dict[str, Any] | None = None, previous: dict[str, Any] | None = None
) -> dict[str, Any]:
    data = (
        None if config_map is None else {k: v if isinstance(v, str) else json.dumps(v) for k, v in config_map.items()}
    )
    document: dict[str, Any] = {"configMap": data, "node": the_node or {}}
    if previous is not None:
        document["previousConfigMap"] = {k: json.dumps(v) for k, v in previous.items()}
    outcome = calc.calculate("nodeslo", json.dumps(document))
    assert outcome.exit_code == 0, outcome.stderr
    spec: dict[str, Any] = json.loads(outcome.stdout)["spec"]
    return spec


THRESHOLD_NODES = {
    "clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 60},
    "nodeStrategies": [
        {**selector("xxx", "yyy"), "cpuSuppressThresholdPercent": 40},
        {**selector("zzz", "zzz"), "cpuSuppressThresholdPercent": 50},
    ],
}


@pytest.mark.parametrize(
    ("labels", "expected"),
    [({}, 60), ({"xxx": "yyy"}, 40), ({"zzz": "zzz"}, 50), ({"xxx": "yyy", "zzz": "zzz"}, 40)],
)
def test_threshold_cluster_and_node_strategies(labels: dict[str, str], expected: int) -> None:
    spec = render({"resource-threshold-config": THRESHOLD_NODES}, node(labels))
    assert spec["resourceUsedThresholdWithBE"] == {
        **THRESHOLD_DEFAULT,
        "enable": True,
        "cpuSuppressThresholdPercent": expected,
    }
    assert spec["cpuBurstStrategy"] == BURST_DEFAULT and spec["resourceQOSStrategy"] == {}


def test_threshold_unmarshal_failure_keeps_the_old_merged_config() -> None:
    previous = {"resource-threshold-config": {"clusterStrategy": {"cpuSuppressThresholdPercent": 30}}}
    spec = render({"resource-threshold-config": "invalid_content"}, node(), previous)
    assert spec["resourceUsedThresholdWithBE"] == {**THRESHOLD_DEFAULT, "cpuSuppressThresholdPercent": 30}
    # An empty ConfigMap is not an error: every key takes its default, whatever the previous config said.
    assert render({}, node(), previous) == DEFAULT_SPEC


def test_no_configmap_and_an_invalid_field_give_the_manager_defaults() -> None:
    assert render(None) == DEFAULT_SPEC
    invalid = {
        "resource-threshold-config": '{"clusterStrategy":{"invalidField","cpuSuppressThresholdPercent":60}}',
        "resource-qos-config": '{"clusterStrategy":{"invalidField"}}',
    }
    assert render(invalid) == DEFAULT_SPEC


QOS_NODES = {
    "clusterStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 0}}},
    "nodeStrategies": [
        {**selector("xxx", "yyy"), "beClass": {"cpuQOS": {"groupIdentity": 0}}},
        {**selector("zzz", "zzz"), "beClass": {"cpuQOS": {"groupIdentity": -1}}},
    ],
}


@pytest.mark.parametrize(("labels", "expected"), [({}, 0), ({"xxx": "yyy"}, 0), ({"zzz": "zzz"}, -1)])
def test_qos_strategy_is_rendered_without_koordlet_defaults(labels: dict[str, str], expected: int) -> None:
    spec = render({"resource-qos-config": QOS_NODES}, node(labels))
    assert spec["resourceQOSStrategy"] == {"beClass": {"cpuQOS": {"groupIdentity": expected}}}


def test_qos_unmarshal_failure_keeps_the_old_config() -> None:
    previous = {
        "resource-qos-config": {
            "clusterStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 2}, "memoryQOS": {"minLimitPercent": 40}}}
        }
    }
    spec = render({"resource-qos-config": "invalid_content"}, node(), previous)
    assert spec["resourceQOSStrategy"] == {
        "beClass": {"cpuQOS": {"groupIdentity": 2}, "memoryQOS": {"minLimitPercent": 40}}
    }


def test_qos_text_with_whitespace_and_newlines() -> None:
    text = json.dumps({"clusterStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 0}}}}, indent=2) + "\n"
    spec = render(
        {
            "resource-qos-config": text,
            "resource-threshold-config": '{"clusterStrategy":{"enable":false,"cpuSuppressThresholdPercent":60}}',
        }
    )
    assert spec["resourceQOSStrategy"] == {"beClass": {"cpuQOS": {"groupIdentity": 0}}}
    assert spec["resourceUsedThresholdWithBE"] == {**THRESHOLD_DEFAULT, "cpuSuppressThresholdPercent": 60}


BURST_NODES = {
    "clusterStrategy": {"cfsQuotaBurstPeriodSeconds": 120},
    "nodeStrategies": [
        {**selector("xxx", "yyy"), "cpuBurstPercent": 100},
        {**selector("zzz", "zzz"), "cpuBurstPercent": 200},
    ],
}


@pytest.mark.parametrize(("labels", "percent"), [({}, 1000), ({"xxx": "yyy"}, 100), ({"zzz": "zzz"}, 200)])
def test_burst_node_strategies_start_from_the_merged_cluster_strategy(labels: dict[str, str], percent: int) -> None:
    spec = render({"cpu-burst-config": BURST_NODES}, node(labels))
    assert spec["cpuBurstStrategy"] == {**BURST_DEFAULT, "cfsQuotaBurstPeriodSeconds": 120, "cpuBurstPercent": percent}


def test_burst_unmarshal_failure_keeps_the_old_config_even_below_the_webhook_minimum() -> None:
    previous = {"cpu-burst-config": {"clusterStrategy": {"cfsQuotaBurstPercent": 30}}}
    spec = render({"cpu-burst-config": "invalid_content"}, node(), previous)
    assert spec["cpuBurstStrategy"] == {**BURST_DEFAULT, "cfsQuotaBurstPercent": 30}


SYSTEM_NODES = {  # as json.Marshal writes the Go test's SystemCfg
    "clusterStrategy": {"watermarkScaleFactor": 151, "totalNetworkBandwidth": "0"},
    "nodeStrategies": [
        {**selector("xxx", "yyy"), "minFreeKbytesFactor": 130, "memcgReapBackGround": 1, "totalNetworkBandwidth": "0"},
        {**selector("zzz", "zzz"), "minFreeKbytesFactor": 140, "memcgReapBackGround": 0, "totalNetworkBandwidth": "0"},
    ],
}


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({}, {"watermarkScaleFactor": 151, "totalNetworkBandwidth": 0}),
        (
            {"xxx": "yyy"},
            {
                "minFreeKbytesFactor": 130,
                "watermarkScaleFactor": 151,
                "memcgReapBackGround": 1,
                "totalNetworkBandwidth": 0,
            },
        ),
        (
            {"zzz": "zzz"},
            {
                "minFreeKbytesFactor": 140,
                "watermarkScaleFactor": 151,
                "memcgReapBackGround": 0,
                "totalNetworkBandwidth": 0,
            },
        ),
    ],
)
def test_system_node_strategies(labels: dict[str, str], expected: dict[str, Any]) -> None:
    assert render({"system-config": SYSTEM_NODES}, node(labels))["systemStrategy"] == expected


def test_system_cluster_only_and_the_old_config_on_failure() -> None:
    cluster = {"clusterStrategy": {"watermarkScaleFactor": 151, "memcgReapBackGround": 1}}
    assert render({"system-config": cluster})["systemStrategy"] == {
        "watermarkScaleFactor": 151,
        "memcgReapBackGround": 1,
        "totalNetworkBandwidth": 0,
    }
    previous = {"system-config": {"clusterStrategy": {"watermarkScaleFactor": 99}}}
    assert render({"system-config": "invalid_content"}, node(), previous)["systemStrategy"] == {
        "watermarkScaleFactor": 99,
        "totalNetworkBandwidth": 0,
    }


SYSTEM_BANDWIDTH = {
    "clusterStrategy": {"minFreeKbytesFactor": 150, "totalNetworkBandwidth": "100M"},
    "nodeStrategies": [
        {**selector("xxx", "yyy"), "minFreeKbytesFactor": 120, "totalNetworkBandwidth": "10M"},
        {**selector("zzz", "zzz"), "minFreeKbytesFactor": 130, "totalNetworkBandwidth": "1000M"},
    ],
}


@pytest.mark.parametrize(
    ("labels", "annotations", "expected"),
    [
        ({}, {}, {"minFreeKbytesFactor": 150, "totalNetworkBandwidth": 100_000_000}),
        ({"zzz": "zzz"}, {}, {"minFreeKbytesFactor": 130, "totalNetworkBandwidth": 1_000_000_000}),
        ({"xxx": "yyy"}, {}, {"minFreeKbytesFactor": 120, "totalNetworkBandwidth": 10_000_000}),
        (
            {},
            {"node.koordinator.sh/network-bandwidth": "99M"},
            {"minFreeKbytesFactor": 150, "totalNetworkBandwidth": 99_000_000},
        ),
        (
            {"zzz": "zzz"},
            {"node.koordinator.sh/network-bandwidth": "99M"},
            {"minFreeKbytesFactor": 130, "totalNetworkBandwidth": 99_000_000},
        ),
    ],
)
def test_system_bandwidth_from_strategies_and_the_node_annotation(
    labels: dict[str, str], annotations: dict[str, str], expected: dict[str, Any]
) -> None:
    assert render({"system-config": SYSTEM_BANDWIDTH}, node(labels, annotations))["systemStrategy"] == expected


def test_a_node_strategy_without_bandwidth_resets_it_to_zero() -> None:
    config = {
        "clusterStrategy": {"totalNetworkBandwidth": "10G"},
        "nodeStrategies": [{**selector("zzz", "zzz"), "minFreeKbytesFactor": 120}],
    }
    assert render({"system-config": config}, node())["systemStrategy"]["totalNetworkBandwidth"] == 10_000_000_000
    assert render({"system-config": config}, node({"zzz": "zzz"}))["systemStrategy"] == {
        "minFreeKbytesFactor": 120,
        "totalNetworkBandwidth": 0,
    }


HOST_APPS = {
    "applications": [{"name": "test-app-default"}],
    "nodeConfigs": [
        {**selector("test-node-key-A", "test-node-value-A"), "applications": [{"name": "test-app-ls", "qos": "LS"}]},
        {**selector("test-node-key-B", "test-node-value-B"), "applications": [{"name": "test-app-lsr", "qos": "LSR"}]},
    ],
}


@pytest.mark.parametrize(
    ("labels", "expected"),
    [
        ({}, [{"name": "test-app-default"}]),
        ({"test-node-key-B": "test-node-value-B"}, [{"name": "test-app-lsr", "qos": "LSR"}]),
        (
            {"test-node-key-A": "test-node-value-A", "test-node-key-B": "test-node-value-B"},
            [{"name": "test-app-ls", "qos": "LS"}],
        ),
    ],
)
def test_host_applications_first_matching_node_config(labels: dict[str, str], expected: list[dict[str, Any]]) -> None:
    assert render({"host-application-config": HOST_APPS}, node(labels))["hostApplications"] == expected


def test_host_applications_absent_key_is_empty_and_a_bad_one_keeps_the_old() -> None:
    previous = {"host-application-config": {"applications": [{"name": "origin-host-app", "qos": "LS"}]}}
    assert "hostApplications" not in render({}, node(), previous)
    spec = render({"host-application-config": "bad-string"}, node(), previous)
    assert spec["hostApplications"] == [{"name": "origin-host-app", "qos": "LS"}]
    new = {"host-application-config": {"applications": [{"name": "new-host-app", "qos": "LS"}]}}
    assert render(new, node(), previous)["hostApplications"] == [{"name": "new-host-app", "qos": "LS"}]


def test_a_full_configmap_renders_every_part() -> None:
    config_map = {
        "resource-threshold-config": '{"clusterStrategy":{"enable":true,"cpuSuppressThresholdPercent":60}}',
        "resource-qos-config": '{"clusterStrategy":{"beClass":{"cpuQOS":{"groupIdentity":0}}}}',
        "cpu-burst-config": '{"clusterStrategy":{"cfsQuotaBurstPeriodSeconds":60}}',
        "system-config": '{"clusterStrategy":{"minFreeKbytesFactor":150,"watermarkScaleFactor":150,'
        '"schedFeatures": {"ID_ABSOLUTE_EXPEL": true, "ID_EXPELLER_SHARE_CORE": false}}}',
        "host-application-config": '{"applications": [{"name": "test-app"}]}',
        "colocation-config": "not even JSON: ignored here",
    }
    assert render(config_map, node()) == {
        "resourceUsedThresholdWithBE": {**THRESHOLD_DEFAULT, "enable": True, "cpuSuppressThresholdPercent": 60},
        "resourceQOSStrategy": {"beClass": {"cpuQOS": {"groupIdentity": 0}}},
        "cpuBurstStrategy": {**BURST_DEFAULT, "cfsQuotaBurstPeriodSeconds": 60},
        "systemStrategy": {
            "minFreeKbytesFactor": 150,
            "watermarkScaleFactor": 150,
            "schedFeatures": {"ID_ABSOLUTE_EXPEL": True, "ID_EXPELLER_SHARE_CORE": False},
            "totalNetworkBandwidth": 0,
        },
        "extensions": {},
        "hostApplications": [{"name": "test-app"}],
    }


def test_unmarshal_failures_of_every_key_keep_each_old_value() -> None:
    previous = {
        "resource-threshold-config": {"clusterStrategy": {"enable": True}},
        "cpu-burst-config": {"clusterStrategy": {"policy": "auto"}},
        "system-config": {"clusterStrategy": {"totalNetworkBandwidth": "1G"}},
    }
    broken = {
        key: "invalid_content"
        for key in ("resource-threshold-config", "resource-qos-config", "cpu-burst-config", "system-config")
    }
    spec = render(broken, node(), previous)
    assert spec["resourceUsedThresholdWithBE"]["enable"] is True
    assert spec["cpuBurstStrategy"]["policy"] == "auto"
    assert spec["systemStrategy"] == {"totalNetworkBandwidth": 1_000_000_000}
    assert spec["resourceQOSStrategy"] == {}
