"""`koordbus calc loadaware` and `loadaware-estimate` through the real command line: the spec §6.6 worked example by
hand, Koordinator's rejections as `{"error"}`, and malformed input as exit 2 naming the field. The shared vectors
of both kinds run in tests/integration/test_calc_cli.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.integration.test_calc_cli import _calc, _json_calc

GI = 1 << 30


def _worked_example(**changes: Any) -> dict[str, Any]:
    """Spec §6.6: 32 cores / 128 GiB using 12 cores / 64 GiB, a pod of 4 cores / 8 GiB (limits equal)."""
    document: dict[str, Any] = {
        "now": "2026-01-01T12:00:00Z",
        "args": {},
        "node": {"metadata": {"name": "n1"}, "status": {"allocatable": {"cpu": "32", "memory": "128Gi"}}},
        "nodeMetric": {
            "status": {
                "updateTime": "2026-01-01T11:59:30Z",
                "nodeMetric": {"nodeUsage": {"cpu": "12", "memory": "64Gi"}},
            }
        },
        "assignedPods": [],
        "pod": {
            "metadata": {"namespace": "default", "name": "web"},
            "spec": {
                "containers": [
                    {
                        "name": "c",
                        "resources": {
                            "requests": {"cpu": "4", "memory": "8Gi"},
                            "limits": {"cpu": "4", "memory": "8Gi"},
                        },
                    }
                ]
            },
        },
    }
    return document | changes


def test_the_worked_example_of_the_spec() -> None:
    out = _json_calc("loadaware", _worked_example())
    assert out["filter"] == {"status": "Success", "reason": ""}
    assert out["score"] == 48  # cpu (32000 − 15400) × 100 // 32000 = 51, memory 45: (51 + 45) // 2
    assert out["estimated"]["filter"] == {"cpu": 15400, "memory": 64 * GI + round(8 * GI * 0.7)}
    assert out["estimated"]["score"] == out["estimated"]["filter"]
    assert "cpu 48% = (usage 12000 + assigned 0 + pod 3400) / 32000 ≤ 65" in out["explain"]["filter"]["detail"]
    assert out["cache"]["pods"] == [] and out["cache"]["nodeUsage"] == {"cpu": 12000, "memory": 64 * GI}


def test_a_node_over_its_threshold_is_unschedulable_with_koordinators_reason() -> None:
    out = _json_calc("loadaware", _worked_example(args={"usageThresholds": {"cpu": 40}}))
    assert out["filter"] == {"status": "Unschedulable", "reason": "node(s) cpu usage exceed threshold"}


def test_yaml_input_keeps_its_times_to_the_nanosecond(tmp_path: Path) -> None:
    document = _worked_example(
        assignedPods=[
            {
                "pod": {**_worked_example()["pod"], "spec": {**_worked_example()["pod"]["spec"], "nodeName": "n1"}},
                "assignedAt": "2026-01-01T11:59:59.123456789Z",
            }
        ]
    )
    text = yaml.safe_dump(document).replace("'2026-01-01T11:59:59.123456789Z'", "2026-01-01T11:59:59.123456789Z")
    assert "assignedAt: 2026-01-01T11:59:59.123456789Z" in text  # unquoted: YAML would read a timestamp
    (tmp_path / "state.yaml").write_text(text)
    result = _calc("loadaware", "", "--input", str(tmp_path / "state.yaml"))
    assert result.returncode == 0, result.stderr
    (pod,) = json.loads(result.stdout)["cache"]["pods"]
    assert pod["timestamp"].startswith("2026-01-01T11:59:59.1234567")  # past the microsecond (float64 holds ~0.2 µs)


def test_the_help_example_runs() -> None:
    from koordbus.calc import CALCULATORS

    for kind in ("loadaware", "loadaware-estimate"):
        assert "error" not in _json_calc(kind, json.loads(CALCULATORS[kind].example))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"resourceWeights": {"cpu": 0}}, "resourceWeights.cpu: 0 is outside 1..100"),
        ({"nodeMetricExpirationSeconds": 0}, "nodeMetricExpirationSeconds"),
        ({"estimatedScalingFactors": {"memory": 120}}, "estimatedScalingFactors.memory: 120"),
        ({"aggregated": {"usageAggregationType": "p42"}}, "'p42' is not one of"),
        ({"aggregated": {"scoreAggregatedDuration": "-5m"}}, "must not be negative"),
        ({"resourceWeights": {"nvidia.com/gpu": 1}}, "estimatedScalingFactors.nvidia.com/gpu"),
    ],
)
def test_args_koordinator_rejects_are_a_calculation_error(args: dict[str, Any], message: str) -> None:
    out = _json_calc("loadaware", _worked_example(args=args))
    assert list(out) == ["error"] and message in out["error"]


def test_the_estimator_alone_takes_args_unvalidated() -> None:
    pod = _worked_example()["pod"]
    out = _json_calc("loadaware-estimate", {"args": {"estimatedScalingFactors": {"cpu": 110}}, "pod": pod})
    assert out == {"cpu": 4000, "memory": round(8 * GI * 0.7)}  # 4400 capped at the 4-core limit
    node = {"status": {"allocatable": {"cpu": "32", "memory": "1Gi"}}}
    assert _json_calc("loadaware-estimate", {"node": node}) == {"allocatable": {"cpu": 32000, "memory": GI}}


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({k: v for k, v in _worked_example().items() if k != "now"}, "missing required field `now`"),
        ({k: v for k, v in _worked_example().items() if k != "node"}, "missing required field `node`"),
        (_worked_example(now="noon"), "$.now"),
        (
            _worked_example(nodeMetric={"status": {"nodeMetric": {"nodeUsage": {"cpu": "lots"}}}}),
            "$.nodeMetric.status.nodeMetric.nodeUsage.resources.cpu: cannot parse quantity 'lots'",
        ),
        (
            _worked_example(
                nodeMetric={"status": {"nodeMetric": {"aggregatedNodeUsages": [{"duration": "5q", "usage": {}}]}}}
            ),
            "$.nodeMetric.status.nodeMetric.aggregatedNodeUsages[0].duration",
        ),
        (_worked_example(args={"usageThresholds": {"cpu": "high"}}), "$.args"),
        (_worked_example(args={"aggregated": {"usageAggregatedDuration": "soon"}}), "usageAggregatedDuration"),
        (_worked_example(assignedPods=[{"assignedAt": "now"}]), "$.assignedPods[0]"),
        (_worked_example(nodeQoS={"resourceThresholdStrategy": {"enable": "yes"}}), "$.nodeQoS"),
    ],
)
def test_malformed_input_exits_2_naming_the_field(document: dict[str, Any], message: str) -> None:
    result = _calc("loadaware", json.dumps(document))
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("koordbus calc loadaware: ") and message in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
