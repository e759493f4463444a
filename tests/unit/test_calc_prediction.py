"""`koordbus calc histogram` and `koordbus calc prod-reclaimable` in process (CALC-CONTRACT, spec §1.7): the
input shapes, the errors (exit 2 for malformed input, `{"error"}` for what Koordinator rejects) and the outputs."""

from __future__ import annotations

import json
from typing import Any

import pytest

from koordbus import calc

LINEAR = {"type": "linear", "maxValue": 10.0, "bucketSize": 1.0, "epsilon": 1e-15}
GI = 2**30


def _ok(kind: str, doc: Any) -> dict[str, Any]:
    outcome = calc.calculate(kind, doc if isinstance(doc, str) else json.dumps(doc))
    assert outcome.exit_code == 0, outcome.stderr
    out: dict[str, Any] = json.loads(outcome.stdout)
    return out


def _bad(kind: str, doc: Any) -> str:
    outcome = calc.calculate(kind, doc if isinstance(doc, str) else json.dumps(doc))
    assert outcome.exit_code == 2 and outcome.stdout == ""
    assert outcome.stderr.startswith(f"koordbus calc {kind}: ") and outcome.stderr.count("\n") == 1
    return outcome.stderr


@pytest.mark.parametrize("kind", ["histogram", "prod-reclaimable"])
def test_help_examples_run(kind: str) -> None:
    out = _ok(kind, calc.CALCULATORS[kind].example)
    assert "error" not in out


# --- histogram


def test_plain_histogram_ignores_time_and_subtracts_after_adding() -> None:
    doc = {
        "options": LINEAR,
        "halfLifeSeconds": None,
        "samples": [[5, 1, 1], [0, 2, 2], [9e9, 3, 3]],
        "subtract": [[0, 3, 3]],
        "percentiles": [0.0, 0.5, 1.0],
    }
    out = _ok("histogram", doc)
    # Left: {1: 1, 2: 2}, total 3: p0 → end of bucket 1, p50 (1.5) → end of bucket 2.
    assert out["percentiles"] == [2.0, 3.0, 3.0] and out["empty"] is False
    assert out["explain"]["bucketWeights"] == {"1": 1.0, "2": 2.0}
    assert "referenceTime" not in out["explain"]


def test_decaying_histogram_reads_times_to_the_nanosecond() -> None:
    # Half-life 2 s; samples 1 ns after 1234567890 s and 1234567891 s (the reference rounds to 1234567890 s):
    # weights 2^(1e-9/2) and 2^(1.000000001/2). As float64 seconds the nanosecond would be lost.
    doc = (
        '{"options": {"type": "linear", "maxValue": 10, "bucketSize": 1, "epsilon": 1e-15}, "halfLifeSeconds": 2,'
        ' "samples": [[1234567890.000000001, 1, 1], [1234567891.000000001, 2, 1]], "percentiles": [0.4, 0.42]}'
    )
    out = _ok("histogram", doc)
    weights = out["explain"]["bucketWeights"]
    assert weights["1"] == pytest.approx(2 ** (1e-9 / 2), rel=1e-15) != 1.0
    assert weights["2"] == pytest.approx(2 ** (1.000000001 / 2), rel=1e-15)
    assert out["explain"]["referenceTime"] == "2009-02-13T23:31:30Z"
    # bucket 1 holds 1/(1 + √2) = 41.4 % of the weight.
    assert out["percentiles"] == [2.0, 3.0]


def test_times_far_from_now_still_answer() -> None:
    doc = {"options": LINEAR, "halfLifeSeconds": 3600, "samples": [[-1e12, 1, 1], [1e15, 2, 1]], "percentiles": [1.0]}
    out = _ok("histogram", doc)
    assert out["percentiles"] == [3.0] and out["explain"]["referenceTime"].endswith("ns after 0001-01-01T00:00:00Z")


def test_empty_histogram() -> None:
    out = _ok("histogram", {"options": LINEAR, "halfLifeSeconds": 60, "samples": [], "percentiles": [0.5]})
    assert out["percentiles"] == [0.0] and out["empty"] is True


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"options": {**LINEAR, "bucketSize": 0}}, "maxValue and bucketSize must both be positive"),
        (
            {"options": {"type": "exponential", "maxValue": 1, "firstBucketSize": 1, "ratio": 1, "epsilon": 1}},
            "ratio must be > 1.0",
        ),
        ({"options": LINEAR, "samples": [[0, 1, -0.5]]}, "non-negative"),
        ({"options": LINEAR, "halfLifeSeconds": 0}, "halfLifeSeconds must be positive"),
        ({"options": LINEAR, "halfLifeSeconds": -5}, "halfLifeSeconds must be positive"),
    ],
)
def test_rejected_by_the_calculation(doc: dict[str, Any], message: str) -> None:
    out = _ok("histogram", {"percentiles": [0.5], **doc})
    assert message in out["error"] and "percentiles" not in out


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"options": {"type": "linear", "maxValue": 1, "epsilon": 1}}, "$.options.bucketSize: required"),
        ({"options": {"type": "exponential", "maxValue": 1, "epsilon": 1, "ratio": 2}}, "$.options.firstBucketSize"),
        ({"options": {"type": "log", "maxValue": 1, "epsilon": 1}}, "$.options.type"),
        ({"options": LINEAR, "samples": [[0, 1]]}, "$.samples[0]"),
        ({"options": LINEAR, "subtract": [[0, "x", 1]]}, "$.subtract[0][1]"),
        ({"options": LINEAR, "samples": [["NaN", 1, 1]]}, "$.samples[0][0]: Expected a finite number"),
        ({"samples": []}, "missing required field `options`"),
    ],
)
def test_malformed_histogram_input(doc: dict[str, Any], message: str) -> None:
    assert message in _bad("histogram", doc)


# --- prod-reclaimable


def _pod(uid: str, cpu: str, memory: str, created: str, priority: int = 9000) -> dict[str, Any]:
    return {
        "metadata": {"name": uid, "namespace": "ns", "uid": uid, "creationTimestamp": created},
        "spec": {
            "priority": priority,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        },
    }


PREDICTIONS = {
    "__node-sys__": {"p95": {"cpu": "300m", "memory": "512Mi"}, "p98": {"cpu": "500m", "memory": "512Mi"}},
    "__node-koord-prod__": {"p95": {"cpu": "1", "memory": "1Gi"}, "p98": {"cpu": "1200m", "memory": "1Gi"}},
    "__node-__": {},
    "warm": {"p95": {"cpu": "500m", "memory": "768Mi"}, "p98": {"cpu": "1", "memory": "1Gi"}},
}
DOC = {
    "now": "2024-06-01T12:00:00Z",
    "node": {"status": {"allocatable": {"cpu": "8", "memory": "8Gi"}}},
    "pods": [_pod("warm", "2", "2Gi", "2024-05-30T00:00:00Z"), _pod("cold", "1", "1Gi", "2024-06-01T00:00:00Z")],
    "predictions": PREDICTIONS,
}


def test_min_predictor_by_default_with_koordlet_defaults() -> None:
    out = _ok("prod-reclaimable", DOC)
    # pod: warm 550m / 1181116006 peak → 1450m, 2Gi − 1181116006 reclaimable; cold (12 h < 24 h) unpredicted.
    # priority: U = 1430m, 1771674009 against requests 3, 3Gi → 1570m, 3Gi − 1771674009.
    assert out["reclaimable"] == {"cpu": 1450, "memory": 2 * GI - 1181116006}
    assert out["peak"] == {"cpu": 550 + 1000, "memory": 1181116006 + GI}
    assert "error" not in out
    assert out["explain"]["predictor"] == "minPredictor"
    pods = out["explain"]["podReclaimablePredictor"]["pods"]
    assert [(p["uid"], p["outcome"]) for p in pods] == [("warm", "predicted"), ("cold", "cold start")]


def test_cold_start_and_margin_are_inputs() -> None:
    out = _ok("prod-reclaimable", {**DOC, "predictor": "pod", "coldStartSeconds": 43200, "safetyMarginPercent": 0})
    # 12 h old is exactly the cold-start duration: still cold. No margin: peak 500m, 1Gi.
    assert out["peak"] == {"cpu": 500 + 1000, "memory": GI + GI}
    out = _ok("prod-reclaimable", {**DOC, "predictor": "pod", "coldStartSeconds": 43199.999999})
    assert out["explain"]["pods"][1]["outcome"] == "no model"
    assert "UID cold not found" in out["explain"]["podErrors"][0]


def test_a_failed_part_is_null_with_an_error() -> None:
    out = _ok("prod-reclaimable", {**DOC, "node": None})
    assert out["reclaimable"] is None and "node is nil" in out["error"]
    assert out["peak"] == {"cpu": 1550, "memory": 1181116006 + GI}
    missing = {k: v for k, v in PREDICTIONS.items() if k != "__node-sys__"}
    out = _ok("prod-reclaimable", {**DOC, "predictor": "priority", "predictions": missing})
    assert out["reclaimable"] is None and out["peak"] is None and "__node-sys__" in out["error"]


def test_raw_allocatable_annotation() -> None:
    node = {
        "metadata": {"annotations": {"node.koordinator.sh/raw-allocatable": '{"cpu": "1", "memory": "1Gi"}'}},
        "status": {"allocatable": {"cpu": "8", "memory": "8Gi"}},
    }
    out = _ok("prod-reclaimable", {**DOC, "predictor": "pod", "node": node})
    assert out["reclaimable"] == {"cpu": 450, "memory": 0}


def test_yaml_input() -> None:
    text = "now: 2024-06-01T12:00:00Z\nnode: null\npods: []\npredictor: pod\n"
    assert _ok("prod-reclaimable", text)["peak"] == {"cpu": 0, "memory": 0}


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({**DOC, "predictions": {"warm": {"p95": {"cpu": "lots"}}}}, "$.predictions.warm.p95.cpu: cannot parse"),
        ({**DOC, "predictions": {"a b": {"p95": []}}}, "$.predictions"),
        ({**DOC, "predictor": "max"}, "$.predictor"),
        ({**DOC, "safetyMarginPercent": "ten"}, "$.safetyMarginPercent"),
        ({**DOC, "now": "noon"}, "$.now"),
        ({"pods": []}, "missing required field `now`"),
    ],
)
def test_malformed_prod_reclaimable_input(doc: dict[str, Any], message: str) -> None:
    assert message in _bad("prod-reclaimable", doc)
