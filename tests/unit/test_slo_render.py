"""services.common.sloconfig and services.slo.render: defaults, cluster/node overlay, first match, bad keys keeping
the last good value, CRD.

Go's decoding rules themselves (types, nulls, duplicates, quantities) are in test_slo_gojson.py; the cases taken from
Koordinator's own nodeslo tests are in test_slo_render_koordinator.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from schemas.jsonmerge import overlay
from services.common.sloconfig import default_config, parse_slo_config
from services.slo.render import ANNOTATION_NETWORK_BANDWIDTH, render_node_slo
from tests.support.crd import crd_errors, crd_validator


def _nodeslo(spec: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": "slo.koordinator.sh/v1alpha1", "kind": "NodeSLO", "metadata": {"name": "n1"}, "spec": spec}


def test_no_keys_render_the_manager_defaults() -> None:
    spec = render_node_slo(parse_slo_config({}), {}, {})
    assert spec == {
        "resourceUsedThresholdWithBE": {
            "enable": False,
            "cpuSuppressThresholdPercent": 65,
            "cpuSuppressPolicy": "cpuset",
            "memoryEvictThresholdPercent": 70,
            "cpuEvictPolicy": "evictByRealLimit",
        },
        "resourceQOSStrategy": {},
        "cpuBurstStrategy": {
            "policy": "none",
            "cpuBurstPercent": 1000,
            "cfsQuotaBurstPercent": 300,
            "cfsQuotaBurstPeriodSeconds": -1,
            "sharePoolThresholdPercent": 50,
        },
        "systemStrategy": {"totalNetworkBandwidth": 0},
        "extensions": {},
    }
    assert not crd_errors(crd_validator("slo.koordinator.sh_nodeslos.yaml"), _nodeslo(spec))


THRESHOLD = {
    "clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 60, "unknownField": 1},
    "nodeStrategies": [
        {"name": "gpu", "nodeSelector": {"matchLabels": {"pool": "gpu"}}, "cpuSuppressThresholdPercent": 40},
        {"name": "all-a", "nodeSelector": {"matchLabels": {"zone": "a"}}, "memoryEvictThresholdPercent": 80},
    ],
}


def test_cluster_overlays_default_and_the_first_matching_node_entry_wins() -> None:
    config = parse_slo_config({"resource-threshold-config": json.dumps(THRESHOLD)})
    assert not config.errors
    cluster = render_node_slo(config, {"zone": "b"}, {})["resourceUsedThresholdWithBE"]
    assert cluster == {
        "enable": True,
        "cpuSuppressThresholdPercent": 60,
        "cpuSuppressPolicy": "cpuset",
        "memoryEvictThresholdPercent": 70,
        "cpuEvictPolicy": "evictByRealLimit",
    }
    both = render_node_slo(config, {"pool": "gpu", "zone": "a"}, {})["resourceUsedThresholdWithBE"]
    assert both["cpuSuppressThresholdPercent"] == 40 and both["memoryEvictThresholdPercent"] == 70
    assert both["enable"] is True  # the node entry starts from the cluster strategy, not the default
    zone_a = render_node_slo(config, {"zone": "a"}, {})["resourceUsedThresholdWithBE"]
    assert zone_a["cpuSuppressThresholdPercent"] == 60 and zone_a["memoryEvictThresholdPercent"] == 80


def test_keys_match_case_insensitively_and_null_means_absent() -> None:
    text = json.dumps({"ClusterStrategy": {"CPUBurstPercent": 500, "policy": None}})
    burst = render_node_slo(parse_slo_config({"cpu-burst-config": text}), {}, {})["cpuBurstStrategy"]
    assert burst["cpuBurstPercent"] == 500 and burst["policy"] == "none"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{not json", "$: not JSON"),
        ("", "$: not JSON"),
        ('["a"]', "$: expected an object, got an array"),
        ('{"clusterStrategy": {"cpuSuppressThresholdPercent": 150}}', "out of range [0, 100]"),
        ('{"clusterStrategy": {"cpuSuppressThresholdPercent": 60.0}}', "expected an integer, got the number 60.0"),
        ('{"clusterStrategy": {"enable": "yes"}}', "$.clusterStrategy.enable: expected true or false, got the string"),
        ('{"nodeStrategies": {"nodeSelector": {}}}', "$.nodeStrategies: expected an array, got an object"),
        ('{"nodeStrategies": [{"nodeSelector": {"matchLabels": {"a": 1}}}]}', "nodeSelector.matchLabels.a: expected"),
    ],
)
def test_a_bad_key_keeps_its_last_good_value_and_reports_why(text: str, reason: str) -> None:
    good = parse_slo_config({"resource-threshold-config": json.dumps(THRESHOLD), "cpu-burst-config": "{}"})
    bad = parse_slo_config({"resource-threshold-config": text, "cpu-burst-config": "{}"}, previous=good)
    assert reason in bad.errors["resource-threshold-config"]
    assert bad.strategies["resource-threshold-config"] == good.strategies["resource-threshold-config"]
    assert "cpu-burst-config" not in bad.errors
    first_time = parse_slo_config({"resource-threshold-config": text})
    assert (
        first_time.strategies["resource-threshold-config"] == default_config().strategies["resource-threshold-config"]
    )


def test_a_removed_key_goes_back_to_the_default() -> None:
    good = parse_slo_config({"resource-threshold-config": json.dumps(THRESHOLD)})
    again = parse_slo_config({}, previous=good)
    assert render_node_slo(again, {}, {})["resourceUsedThresholdWithBE"]["enable"] is False


def test_node_entries_without_a_usable_selector_are_skipped_not_errors() -> None:
    text = json.dumps(
        {
            "clusterStrategy": {"cpuSuppressThresholdPercent": 60},
            "nodeStrategies": [
                {"name": "no-selector", "cpuSuppressThresholdPercent": 10},
                {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "Near"}]}, "enable": True},
                {"nodeSelector": {"matchExpressions": [{"key": "a", "operator": "In"}]}, "enable": True},
                {"nodeSelector": {"matchLabels": {"bad key!": "x"}}, "enable": True},
                {"nodeSelector": {"matchLabels": {"pool": "gpu"}}, "cpuSuppressThresholdPercent": 40},
                {"nodeSelector": {}, "cpuSuppressThresholdPercent": 50},
            ],
        }
    )
    config = parse_slo_config({"resource-threshold-config": text})
    assert not config.errors  # Koordinator logs each bad selector and goes on with the next entry
    for labels, expected in (({}, 50), ({"a": "x", "bad key!": "x"}, 50), ({"pool": "gpu"}, 40)):
        threshold = render_node_slo(config, labels, {})["resourceUsedThresholdWithBE"]
        assert threshold["cpuSuppressThresholdPercent"] == expected and threshold["enable"] is False


def test_network_bandwidth_annotation_overrides_the_system_strategy() -> None:
    config = parse_slo_config({"system-config": json.dumps({"clusterStrategy": {"totalNetworkBandwidth": "1G"}})})
    assert render_node_slo(config, {}, {})["systemStrategy"]["totalNetworkBandwidth"] == 10**9  # Value()
    spec = render_node_slo(config, {}, {ANNOTATION_NETWORK_BANDWIDTH: "10Gi"})
    assert spec["systemStrategy"]["totalNetworkBandwidth"] == 10 * 2**30
    assert render_node_slo(config, {}, {ANNOTATION_NETWORK_BANDWIDTH: "1.5"})["systemStrategy"] == {
        "totalNetworkBandwidth": 2  # rounded up
    }
    # Koordinator fails getSystemConfigSpec on an unparsable annotation: the spec goes without a systemStrategy.
    for bad in ("fast", " 10G", ""):
        spec = render_node_slo(config, {}, {ANNOTATION_NETWORK_BANDWIDTH: bad})
        assert "systemStrategy" not in spec and spec["resourceUsedThresholdWithBE"]["enable"] is False


def test_host_applications_node_entry_replaces_the_list() -> None:
    text = json.dumps(
        {
            "applications": [{"name": "nginx", "qos": "LS"}, {"name": "agent", "qos": "BE"}],
            "nodeConfigs": [
                {"name": "edge", "nodeSelector": {"matchLabels": {"edge": "true"}}, "applications": [{"name": "x"}]}
            ],
        }
    )
    config = parse_slo_config({"host-application-config": text})
    assert [a["name"] for a in render_node_slo(config, {}, {})["hostApplications"]] == ["nginx", "agent"]
    assert render_node_slo(config, {"edge": "true"}, {})["hostApplications"] == [{"name": "x"}]
    broken = parse_slo_config({"host-application-config": '{"applications": [{"qos": 3}]}'}, previous=config)
    assert broken.errors["host-application-config"] == "$.applications[0].qos: expected a string, got the number 3"
    assert broken.host_applications == config.host_applications
    assert "hostApplications" not in render_node_slo(parse_slo_config({}, previous=config), {}, {})


def test_host_applications_are_decoded_as_go_types() -> None:
    text = json.dumps(
        {
            "applications": [
                {"name": "a", "qos": "", "strategy": {"anything": 1}, "cgroupPath": {"base": "", "parentDir": "p"}},
                None,
            ],
            "nodeConfigs": [{"nodeSelector": {"matchLabels": {"edge": "true"}}}, {"applications": [{"name": "z"}]}],
        }
    )
    config = parse_slo_config({"host-application-config": text})
    assert render_node_slo(config, {}, {})["hostApplications"] == [
        {"name": "a", "cgroupPath": {"parentDir": "p"}, "strategy": {}},
        {},  # a null item is Go's zero HostApplicationSpec
    ]
    # The matching entry has no applications: the node gets none (its list replaces the top-level one).
    assert "hostApplications" not in render_node_slo(config, {"edge": "true"}, {})


def test_overlay_merges_objects_replaces_lists_and_drops_empty_lists() -> None:
    base = {"a": {"x": 1, "y": 2}, "l": [1, 2], "s": "keep"}
    assert overlay(base, {"a": {"y": 3}, "l": [], "s": None}) == {"a": {"x": 1, "y": 3}, "l": [1, 2], "s": "keep"}
    assert overlay(base, {"l": [9]})["l"] == [9]


def test_rendered_specs_from_a_full_config_validate_against_the_crd() -> None:
    data = {
        "resource-threshold-config": json.dumps(THRESHOLD),
        "resource-qos-config": json.dumps(
            {"clusterStrategy": {"beClass": {"resctrlQOS": {"enable": True, "catRangeEndPercent": 30}}}}
        ),
        "cpu-burst-config": json.dumps({"clusterStrategy": {"policy": "auto", "cfsQuotaBurstPercent": 200}}),
        "system-config": json.dumps({"clusterStrategy": {"minFreeKbytesFactor": 100, "schedFeatures": {"a": True}}}),
        "host-application-config": json.dumps({"applications": [{"name": "nginx", "qos": "LS"}]}),
    }
    config = parse_slo_config(data)
    assert not config.errors
    validator = crd_validator("slo.koordinator.sh_nodeslos.yaml")
    for labels in ({}, {"pool": "gpu"}, {"zone": "a"}):
        spec = render_node_slo(config, labels, {ANNOTATION_NETWORK_BANDWIDTH: "25Gi"})
        assert not crd_errors(validator, _nodeslo(spec)), spec
    assert spec["resourceQOSStrategy"]["beClass"]["resctrlQOS"]["catRangeEndPercent"] == 30


def test_int_or_string_fields_keep_their_form() -> None:
    strategy = {"beClass": {"networkQOS": {"ingressLimit": 80, "egressLimit": "50M", "egressRequest": "any text"}}}
    config = parse_slo_config({"resource-qos-config": json.dumps({"clusterStrategy": strategy})})
    assert render_node_slo(config, {}, {})["resourceQOSStrategy"] == strategy  # Go's IntOrString takes any string


def test_resource_qos_is_checked_and_pruned_field_by_field() -> None:
    text = json.dumps(
        {
            "clusterStrategy": {
                "policies": {"cpuPolicy": "coreSched", "extra": 1},
                "beClass": {
                    "cpuQOS": {"enable": True, "groupIdentity": -1, "typo": 3},
                    "blkioQOS": {"blocks": [{"name": "sda", "type": "device", "ioCfg": {"readIOPS": 10, "x": 1}}]},
                    "networkQOS": {"ingressLimit": "100M"},
                },
                "unknownClass": {},
            },
            "nodeStrategies": [
                {"nodeSelector": {"matchLabels": {"a": "b"}}, "beClass": {"cpuQOS": {"groupIdentity": 0}}}
            ],
        }
    )
    config = parse_slo_config({"resource-qos-config": text})
    assert not config.errors
    qos = render_node_slo(config, {}, {})["resourceQOSStrategy"]
    assert qos == {
        "policies": {"cpuPolicy": "coreSched"},
        "beClass": {
            "cpuQOS": {"enable": True, "groupIdentity": -1},
            "blkioQOS": {"blocks": [{"name": "sda", "type": "device", "ioCfg": {"readIOPS": 10}}]},
            "networkQOS": {"ingressLimit": "100M"},
        },
    }
    node = render_node_slo(config, {"a": "b"}, {})["resourceQOSStrategy"]
    assert node["beClass"]["cpuQOS"] == {"enable": True, "groupIdentity": 0}
    assert not crd_errors(crd_validator("slo.koordinator.sh_nodeslos.yaml"), _nodeslo(render_node_slo(config, {}, {})))


@pytest.mark.parametrize(
    ("strategy", "reason"),
    [
        ({"lsClass": {"cpuQOS": {"groupIdentity": 3}}}, "lsClass.cpuQOS.groupIdentity: 3 is out of range [-1, 2]"),
        ({"beClass": {"resctrlQOS": {"mbaPercent": 101}}}, "mbaPercent: 101 is out of range"),
        ({"beClass": {"memoryQOS": {"wmarkMinAdj": -26}}}, "wmarkMinAdj: -26 is out of range"),
        ({"beClass": {"blkioQOS": {"blocks": {"name": "sda"}}}}, "blocks: expected an array, got an object"),
        ({"beClass": {"blkioQOS": {"blocks": [None]}}}, "blocks[0]: expected an object, got null"),
        ({"beClass": {"networkQOS": {"egressLimit": 1.5}}}, "egressLimit: expected an int32 or a string"),
        ({"beClass": {"networkQOS": {"egressLimit": 2**31}}}, "egressLimit: expected an int32 or a string"),
        ({"beClass": "on"}, "beClass: expected an object, got the string"),
    ],
)
def test_resource_qos_errors_name_the_field(strategy: dict[str, Any], reason: str) -> None:
    config = parse_slo_config({"resource-qos-config": json.dumps({"clusterStrategy": strategy})})
    assert reason in config.errors["resource-qos-config"]
    assert render_node_slo(config, {}, {})["resourceQOSStrategy"] == {}


def test_a_rendered_spec_is_the_callers_own_copy() -> None:
    config = parse_slo_config({"resource-qos-config": json.dumps({"clusterStrategy": {"beClass": {"cpuQOS": {}}}})})
    spec = render_node_slo(config, {}, {})
    spec["resourceQOSStrategy"]["beClass"]["cpuQOS"]["enable"] = True
    assert render_node_slo(config, {}, {})["resourceQOSStrategy"]["beClass"]["cpuQOS"] == {}
