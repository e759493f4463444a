"""slo-controller-config validation (services.webhook.configmap, services.webhook.admission.validate_configmap) with
the composition root's table (koordbus.webhook): every key koordbus reads is checked by its reader's parser, a bad
key is refused with its JSON path, unchanged or unknown keys never block an edit."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from koordbus.webhook import SLO_CONFIG_VALIDATORS
from services.webhook import admission, configmap

TARGET = ("koordinator-system", "slo-controller-config")
REFERENCE = Path(__file__).resolve().parents[2].parent / "shared" / "reference" / "koordinator-crds"


def request(
    data: dict[str, str] | None,
    *,
    old: dict[str, str] | None = None,
    operation: str = "CREATE",
    name: str = "slo-controller-config",
    namespace: str = "koordinator-system",
) -> admission.AdmissionRequest:
    def cm(values: dict[str, str] | None) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": namespace},
            "data": values,
        }

    return admission.review_request(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-1",
                "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
                "resource": {"group": "", "version": "v1", "resource": "configmaps"},
                "name": name,
                "namespace": namespace,
                "operation": operation,
                "object": cm(data) if operation != "DELETE" else None,
                "oldObject": cm(old) if operation != "CREATE" else None,
            },
        }
    )


def validate(req: admission.AdmissionRequest) -> admission.AdmissionResponse:
    return admission.validate_configmap(req, target=TARGET, validators=SLO_CONFIG_VALIDATORS)


GOOD = {
    "colocation-config": json.dumps(
        {
            "enable": True,
            "cpuReclaimThresholdPercent": 60,
            "nodeConfigs": [{"name": "pool-a", "nodeSelector": {"matchLabels": {"pool": "a"}}, "enable": False}],
        }
    ),
    "resource-threshold-config": json.dumps(
        {
            "clusterStrategy": {"enable": True, "cpuSuppressThresholdPercent": 65},
            "nodeStrategies": [{"nodeSelector": {"matchLabels": {"pool": "b"}}, "memoryEvictThresholdPercent": 60}],
        }
    ),
    "resource-qos-config": json.dumps(
        {"clusterStrategy": {"beClass": {"cpuQOS": {"enable": True, "groupIdentity": -1}}}}
    ),
    "cpu-burst-config": json.dumps({"clusterStrategy": {"policy": "auto", "cpuBurstPercent": 1000}}),
    "system-config": json.dumps({"clusterStrategy": {"minFreeKbytesFactor": 100, "watermarkScaleFactor": 150}}),
    "host-application-config": json.dumps({"applications": [{"name": "nginx", "qos": "LS"}]}),
    "load-watermarks-config": json.dumps({"usageThresholds": {"cpu": 65}, "lowThresholds": {"cpu": 40}}),
    "cpu-normalization-config": json.dumps({"enable": True, "ratioModel": {"Xeon 6348": {"baseRatio": 1.5}}}),
    "someone-elses-key": "not json at all",
}


def test_the_table_covers_every_key_a_service_reads() -> None:
    assert set(SLO_CONFIG_VALIDATORS) == {
        "colocation-config",
        "resource-threshold-config",
        "resource-qos-config",
        "cpu-burst-config",
        "system-config",
        "host-application-config",
        "load-watermarks-config",
        "cpu-normalization-config",
    }


def test_a_good_configmap_and_koordinators_own_samples_pass() -> None:
    assert validate(request(GOOD)).allowed
    for sample in ("slo-controller-config.sample.yaml", "slo-controller-config.e2e.yaml"):
        data = yaml.safe_load((REFERENCE / sample).read_text())["data"]
        assert validate(request(data)).allowed, sample


BAD = {
    "colocation-config": (
        {"enable": True, "midCPUThresholdPercent": 150, "resourceDiffThreshold": 2},
        {"$.midCPUThresholdPercent", "$.resourceDiffThreshold"},
    ),
    "colocation-config ": (  # a nodeConfigs entry: its merged strategy and its selector
        {"nodeConfigs": [{"cpuReclaimThresholdPercent": -1}]},
        {"$.nodeConfigs[0].nodeSelector", "$.nodeConfigs[0].cpuReclaimThresholdPercent"},
    ),
    "resource-threshold-config": (
        {
            "clusterStrategy": {"cpuSuppressThresholdPercent": 101},
            "nodeStrategies": [{"cpuSuppressThresholdPercent": -1}],
        },
        {"$.clusterStrategy.cpuSuppressThresholdPercent", "$.nodeStrategies[0].cpuSuppressThresholdPercent"},
    ),
    "resource-threshold-config ": (  # once the key parses, Koordinator's rule for its node entries
        {"nodeStrategies": [{"nodeSelector": {}}, {"name": "x"}, {"nodeSelector": {"matchLabels": {"a b": "c"}}}]},
        {"$.nodeStrategies[0].nodeSelector", "$.nodeStrategies[1].nodeSelector", "$.nodeStrategies[2].nodeSelector"},
    ),
    "resource-qos-config": ({"clusterStrategy": {"lsClass": {"cpuQOS": {"groupIdentity": 7}}}}, None),
    "cpu-burst-config": ({"clusterStrategy": {"cpuBurstPercent": "lots"}}, None),
    "system-config": ({"clusterStrategy": {"watermarkScaleFactor": 500}}, {"$.clusterStrategy.watermarkScaleFactor"}),
    "host-application-config": ({"applications": [{"name": 3}]}, {"$.applications[0].name"}),
    "load-watermarks-config": ({"usageThresholds": {"cpu": 120}}, {"$.usageThresholds.cpu"}),
    "cpu-normalization-config": (
        {"ratioModel": {"Xeon": {"baseRatio": 9}}, "nodeConfigs": [{"nodeSelector": {"matchLabels": {"a": "b"}}}]},
        {'$.ratioModel["Xeon"].baseRatio'},
    ),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_key_is_refused_with_its_json_path(case: str) -> None:
    key = case.strip()
    value, paths = BAD[case]
    response = validate(request({**GOOD, key: json.dumps(value)}))
    assert not response.allowed and response.status is not None
    assert response.status.code == 403 and response.status.reason == "Forbidden"
    assert response.status.details is not None
    causes = response.status.details.causes
    assert causes and {cause.field for cause in causes} == {f"data[{key}]"}
    found = {cause.message.split(": ")[1] for cause in causes}
    if paths is not None:
        assert found == paths, response.status.message
    assert all(message.startswith(f"data.{key}: $") for message in (c.message for c in causes))
    assert f"data.{key}: " in response.status.message


def test_every_bad_key_is_listed_in_one_refusal() -> None:
    data = {**GOOD, "cpu-burst-config": "{", "load-watermarks-config": '{"unknown": 1}', "system-config": "[]"}
    response = validate(request(data))
    assert response.status is not None
    message = response.status.message
    assert message.startswith("koordinator-system/slo-controller-config: 3 problems in cpu-burst-config, ")
    for key in ("cpu-burst-config", "load-watermarks-config", "system-config"):
        assert f"data.{key}: $" in message


def test_a_value_no_parser_can_read_is_a_problem_not_an_error() -> None:
    deep = '{"a":' * 20000 + "1" + "}" * 20000
    found = configmap.problems({key: deep for key in SLO_CONFIG_VALIDATORS}, None, SLO_CONFIG_VALIDATORS)
    assert {problem.key for problem in found} >= {"colocation-config", "load-watermarks-config"}
    assert all(problem.path.startswith("$") for problem in found)


def test_an_update_checks_only_the_keys_it_adds_or_changes() -> None:
    bad_burst = json.dumps({"clusterStrategy": {"cpuBurstPercent": 20000}})
    old = {**GOOD, "cpu-burst-config": bad_burst}
    edited = {**old, "system-config": json.dumps({"clusterStrategy": {"minFreeKbytesFactor": 200}})}
    assert validate(request(edited, old=old, operation="UPDATE")).allowed  # the bad key was there already
    assert validate(request({**GOOD, "someone-elses-key": "{"}, old=GOOD, operation="UPDATE")).allowed
    removed = {k: v for k, v in old.items() if k != "cpu-burst-config"}
    assert validate(request(removed, old=old, operation="UPDATE")).allowed
    refused = validate(request({**edited, "system-config": "{"}, old=old, operation="UPDATE"))
    assert refused.status is not None and "system-config" in refused.status.message
    assert "cpu-burst-config" not in refused.status.message
    assert not validate(request({**GOOD, "cpu-burst-config": bad_burst}, old=GOOD, operation="UPDATE")).allowed


def test_other_configmaps_deletes_and_other_resources_pass() -> None:
    broken = {"colocation-config": "{"}
    assert validate(request(broken, name="other")).allowed
    assert validate(request(broken, namespace="default")).allowed
    assert validate(request(None, old=broken, operation="DELETE")).allowed
    assert validate(request(None)).allowed  # no data: every key takes its default
    not_strings = admission.review_request(
        {
            "apiVersion": "admission.k8s.io/v1",
            "kind": "AdmissionReview",
            "request": {
                "uid": "u-2",
                "kind": {"kind": "ConfigMap", "version": "v1"},
                "resource": {"version": "v1", "resource": "configmaps"},
                "namespace": TARGET[0],
                "name": TARGET[1],
                "operation": "CREATE",
                "object": {"metadata": {"name": TARGET[1]}, "data": {"colocation-config": {"enable": True}}},
            },
        }
    )
    response = validate(not_strings)
    assert not response.allowed and response.status is not None
    assert response.status.message == "request.object.data: expected a map of strings"


@pytest.mark.parametrize(
    ("message", "problem"),
    [
        ("Expected `int`, got `str` - at `$.a[0].b`", ("$.a[0].b", "expected int, got str")),
        (
            "$.lowThresholds.cpu: 50 is not under usageThresholds.cpu (40)",
            ("$.lowThresholds.cpu", "50 is not under usageThresholds.cpu (40)"),
        ),
        ("something else", ("$", "something else")),
    ],
)
def test_parser_messages_become_a_path_and_a_reason(message: str, problem: tuple[str, str]) -> None:
    assert configmap.problem_of(message) == problem
