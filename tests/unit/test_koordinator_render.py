"""Koordinator JSON shapes (schemas.koordinator): Go durations, times, the collect policy and NodeMetric objects.

Rendered objects are validated against Koordinator's NodeMetric CRD schema from ../shared, made strict the
way the API server's pruning is: a field the schema does not declare would be silently dropped, so here it
fails.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import jsonschema
import msgspec
import pytest

from schemas import koordinator, node
from tests.support.crd import NODEMETRIC_CRD, crd_errors, crd_validator
from tests.support.koordinator_objects import nodemetric_status

RFC3339_UTC = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")


# --- Go durations and times


@pytest.mark.parametrize(
    ("seconds", "text"),
    [(0, "0s"), (30, "30s"), (300, "5m0s"), (600, "10m0s"), (3600, "1h0m0s"), (5400, "1h30m0s"), (90.5, "1m30.5s")],
)
def test_format_go_duration(seconds: float, text: str) -> None:
    assert koordinator.format_go_duration(seconds) == text


@pytest.mark.parametrize(("seconds", "text"), [(0.5, "500ms"), (0.0015, "1.5ms"), (-300, "-5m0s"), (86400, "24h0m0s")])
def test_format_go_duration_small_and_negative(seconds: float, text: str) -> None:
    assert koordinator.format_go_duration(seconds) == text


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5m", 300), ("1h30m", 5400), ("300s", 300), ("5m0s", 300), ("1.5h", 5400), ("0", 0), ("-2m", -120)],
)
def test_parse_go_duration(text: str, seconds: int) -> None:
    assert koordinator.parse_go_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5", "5x", "m", "1h 30m", "-", "1.2.3s"])
def test_parse_go_duration_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid duration"):
        koordinator.parse_go_duration(text)


def test_durations_round_trip() -> None:
    for seconds in (1, 59, 60, 61, 3599, 3600, 3661, 86400 * 3):
        assert koordinator.parse_go_duration(koordinator.format_go_duration(seconds)) == seconds


def test_rfc3339() -> None:
    assert koordinator.format_rfc3339(1795317300.9) == "2026-11-22T03:15:00Z"
    assert koordinator.parse_rfc3339("2026-11-22T03:15:00Z") == 1795317300
    assert koordinator.parse_rfc3339("2026-11-22T05:15:00+02:00") == 1795317300
    assert koordinator.parse_rfc3339("2026-11-22T03:15:00") == 1795317300
    with pytest.raises(ValueError, match="RFC 3339"):
        koordinator.parse_rfc3339("yesterday")


# --- collect policy


def test_collect_policy_defaults_and_overlay() -> None:
    assert koordinator.collect_policy_from_json({}) == node.MetricCollectPolicy()
    policy = koordinator.collect_policy_from_json(
        {
            "reportIntervalSeconds": 20,
            "nodeAggregatePolicy": {"durations": ["1m", "1h30m", "300s"]},
            "nodeMemoryCollectPolicy": "usageWithPageCache",
        }
    )
    assert policy == node.MetricCollectPolicy(
        report_interval_seconds=20,
        durations_seconds=(60, 5400, 300),
        node_memory_collect_policy="usageWithPageCache",
    )
    # an empty object keeps the default durations (JSON merge); an empty list replaces them
    assert koordinator.collect_policy_from_json({"nodeAggregatePolicy": {}}).durations_seconds == (300, 600, 1800)
    assert koordinator.collect_policy_from_json({"nodeAggregatePolicy": {"durations": []}}).durations_seconds == ()


def test_collect_policy_round_trip() -> None:
    policy = node.MetricCollectPolicy(aggregate_duration_seconds=120, durations_seconds=(60, 3600))
    rendered = koordinator.collect_policy_to_json(policy)
    assert rendered["nodeAggregatePolicy"] == {"durations": ["1m0s", "1h0m0s"]}
    assert koordinator.collect_policy_from_json(rendered) == policy


@pytest.mark.parametrize(
    ("obj", "where"),
    [
        ({"nodeMemoryCollectPolicy": "everything"}, "$.nodeMemoryCollectPolicy"),
        ({"reportIntervalSeconds": "60"}, "$.reportIntervalSeconds"),
        ({"nodeAggregatePolicy": {"durations": ["5m", "soon"]}}, "$.nodeAggregatePolicy.durations[1]"),
        ({"nodeAggregatePolicy": {"durations": ["1500ms"]}}, "$.nodeAggregatePolicy.durations[0]"),
    ],
)
def test_collect_policy_errors_name_the_field(obj: dict[str, Any], where: str) -> None:
    with pytest.raises(ValueError, match=re.escape(where)):
        koordinator.collect_policy_from_json(obj)


def test_format_error_reroots_its_path() -> None:
    err = koordinator.KoordinatorFormatError("$.a[0]", "bad")
    assert str(err.under("$.spec")) == "$.spec.a[0]: bad"


# --- status rendering


def _status(*, cold: bool = False, empty: bool = False) -> node.NodeMetricStatus:
    """A status from the real core: 400 s of 1 s samples (or 100 s, to hit cold start; or none at all)."""
    return nodemetric_status(span=0 if empty else (100 if cold else 400))


def test_status_shape_with_integers() -> None:
    out = koordinator.nodemetric_status_to_json(_status(), quantities=False)
    assert out["updateTime"] == "2026-11-22T03:15:00Z"
    info = out["nodeMetric"]
    assert set(info) == {"nodeUsage", "aggregatedNodeUsages", "systemUsage", "aggregatedSystemUsages"}
    assert isinstance(info["nodeUsage"]["resources"]["cpu"], int)
    assert [a["duration"] for a in info["aggregatedNodeUsages"]] == ["5m0s", "10m0s"]
    assert set(info["aggregatedNodeUsages"][0]["usage"]) == {"avg", "p50", "p90", "p95", "p99"}
    assert info["aggregatedNodeUsages"][1]["usage"]["avg"]["resources"]  # 399 s of data ≥ half of 10 min
    assert out["podsMetric"] == [
        {
            "namespace": "batch",
            "name": "job",
            "podUsage": {"resources": {"cpu": 1500, "memory": 2**30}},
            "priority": "koord-batch",
            "qos": "BE",
        },
        {
            "namespace": "default",
            "name": "web",
            "podUsage": {"resources": {"cpu": 250, "memory": 512 * 2**20}},
            "priority": "koord-prod",
            "qos": "LS",
        },
    ]


def test_status_shape_with_quantities() -> None:
    out = koordinator.nodemetric_status_to_json(_status(), quantities=True)
    pods = {p["name"]: p["podUsage"]["resources"] for p in out["podsMetric"]}
    assert pods["job"] == {"cpu": "1500m", "memory": "1Gi"}
    assert pods["web"] == {"cpu": "250m", "memory": "512Mi"}
    assert out["nodeMetric"]["nodeUsage"]["resources"]["cpu"].endswith("m")


def test_cold_start_and_empty_maps_render_as_empty_objects() -> None:
    cold = koordinator.nodemetric_status_to_json(_status(cold=True), quantities=True)["nodeMetric"]
    assert cold["nodeUsage"]["resources"]  # no cold-start rule for nodeUsage
    assert all(rm == {} for a in cold["aggregatedNodeUsages"] for rm in a["usage"].values())
    empty = koordinator.nodemetric_status_to_json(_status(empty=True), quantities=True)
    assert empty["nodeMetric"]["nodeUsage"] == {}
    assert empty["podsMetric"] == []


def test_nodemetric_object() -> None:
    spec = node.MetricCollectPolicy()
    obj = koordinator.nodemetric_object("node-a", spec, _status())
    assert obj["apiVersion"] == "slo.koordinator.sh/v1alpha1"
    assert obj["kind"] == "NodeMetric"
    assert obj["metadata"] == {"name": "node-a"}
    assert koordinator.collect_policy_from_json(obj["spec"]["metricCollectPolicy"]) == spec
    assert "status" not in koordinator.nodemetric_object("node-a", spec, None)


# --- CRD validation


@pytest.fixture(scope="module")
def validator() -> jsonschema.protocols.Validator:
    return crd_validator(NODEMETRIC_CRD)


_errors = crd_errors


@pytest.mark.parametrize("variant", ["full", "cold", "empty"])
def test_rendered_objects_validate_against_the_crd(validator: jsonschema.protocols.Validator, variant: str) -> None:
    status = _status(cold=variant == "cold", empty=variant == "empty")
    obj = koordinator.nodemetric_object("node-a", node.MetricCollectPolicy(), status)
    assert _errors(validator, obj) == []
    assert RFC3339_UTC.match(obj["status"]["updateTime"])


def test_integer_amounts_also_validate(validator: jsonschema.protocols.Validator) -> None:
    obj = koordinator.nodemetric_object("node-a", node.MetricCollectPolicy(), None)
    obj["status"] = koordinator.nodemetric_status_to_json(_status(), quantities=False)
    assert _errors(validator, obj) == []


def test_the_validator_catches_mistakes(validator: jsonschema.protocols.Validator) -> None:
    good = koordinator.nodemetric_object("node-a", node.MetricCollectPolicy(), _status())
    misspelt = copy.deepcopy(good)
    misspelt["status"]["nodeMetric"]["aggregatedNodeUsage"] = misspelt["status"]["nodeMetric"].pop(
        "aggregatedNodeUsages"
    )
    bad_quantity = copy.deepcopy(good)
    bad_quantity["status"]["podsMetric"][0]["podUsage"]["resources"]["cpu"] = "1.5 cores"
    bad_policy = copy.deepcopy(good)
    bad_policy["spec"]["metricCollectPolicy"]["nodeMemoryCollectPolicy"] = "all"
    for obj in (misspelt, bad_quantity, bad_policy):
        assert _errors(validator, obj)


def test_status_struct_survives_a_json_round_trip() -> None:
    status = _status()
    assert msgspec.json.decode(msgspec.json.encode(status), type=node.NodeMetricStatus) == status


# --- hostApplicationMetric


def _with_host_applications() -> node.NodeMetricStatus:
    apps = [
        node.HostApplicationMetric(
            name="nginx",
            usage=node.ResourceMap(resources={"cpu": 1250, "memory": 3 * 2**30}),
            priority="koord-prod",
            qos="LS",
        ),
        node.HostApplicationMetric(name="sshd", usage=node.ResourceMap(resources={"cpu": 5, "memory": 2**20})),
    ]
    return msgspec.structs.replace(_status(), host_applications=apps)


def test_host_application_metric_is_rendered_in_koordinators_shape() -> None:
    out = koordinator.nodemetric_status_to_json(_with_host_applications(), quantities=True)
    assert out["hostApplicationMetric"] == [
        {
            "name": "nginx",
            "usage": {"resources": {"cpu": "1250m", "memory": "3Gi"}},
            "priority": "koord-prod",
            "qos": "LS",
        },
        {"name": "sshd", "usage": {"resources": {"cpu": "5m", "memory": "1Mi"}}, "priority": "", "qos": ""},
    ]
    integers = koordinator.nodemetric_status_to_json(_with_host_applications(), quantities=False)
    assert integers["hostApplicationMetric"][0]["usage"] == {"resources": {"cpu": 1250, "memory": 3 * 2**30}}
    assert "hostApplicationMetric" not in koordinator.nodemetric_status_to_json(_status(), quantities=True)


def test_host_application_metric_validates_against_the_crd(validator: jsonschema.protocols.Validator) -> None:
    obj = koordinator.nodemetric_object("node-a", node.MetricCollectPolicy(), _with_host_applications())
    assert _errors(validator, obj) == []
    misspelt = copy.deepcopy(obj)
    misspelt["status"]["hostApplicationMetric"][0]["podUsage"] = misspelt["status"]["hostApplicationMetric"][0].pop(
        "usage"
    )
    assert _errors(validator, misspelt)


def test_a_status_without_host_applications_decodes_as_before() -> None:
    """Statuses published before host applications existed carry no such field; they decode with none."""
    encoded = msgspec.json.encode(_status())
    assert b"host_applications" not in encoded
    assert msgspec.json.decode(encoded, type=node.NodeMetricStatus).host_applications == []
    status = _with_host_applications()
    assert msgspec.json.decode(msgspec.json.encode(status), type=node.NodeMetricStatus) == status
