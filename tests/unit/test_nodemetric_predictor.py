"""Prod reclaimable / peak prediction (spec §1.7): training the models, and the pod, priority and min predictors
with cold start, safety margin, terminating pods and raw allocatable, against hand-computed numbers."""

from __future__ import annotations

import datetime as dt
import gc
from typing import Any

import pytest

from schemas import kube
from services.nodemetric import histogram as hist
from services.nodemetric import predictor as pred

GI = 2**30
MI = 2**20
NOW = dt.datetime(2024, 6, 1, 12, 0, tzinfo=dt.UTC)
NOW_NS = pred.unix_ns(NOW)
HOUR_NS = 3600 * pred.SECOND_NS


def _pod(
    uid: str,
    cpu: str,
    memory: str,
    *,
    age: dt.timedelta = dt.timedelta(hours=2),
    priority: int | None = 9000,
    deleting: bool = False,
    phase: str = "Running",
) -> pred.PodFacts:
    meta: dict[str, Any] = {"name": uid, "namespace": "ns", "uid": uid, "creationTimestamp": NOW - age}
    if deleting:
        meta["deletionTimestamp"] = NOW
    pod = kube.Pod(
        metadata=kube.ObjectMeta(**{_snake(k): v for k, v in meta.items()}),
        spec=kube.PodSpec(
            priority=priority,
            containers=[kube.Container(resources=kube.ResourceRequirements(requests={"cpu": cpu, "memory": memory}))],
        ),
        status=kube.PodStatus(phase=phase),
    )
    return pred.pod_facts(pod)


def _snake(key: str) -> str:
    return {"creationTimestamp": "creation_timestamp", "deletionTimestamp": "deletion_timestamp"}.get(key, key)


def _node(cpu: str = "3", memory: str = "3Gi", annotations: dict[str, str] | None = None) -> kube.Node:
    return kube.Node(
        metadata=kube.ObjectMeta(annotations=annotations or {}),
        status=kube.NodeStatus(allocatable={"cpu": cpu, "memory": memory}),
    )


def _model(p95: tuple[int, int], p98: tuple[int, int]) -> pred.Prediction:
    return {"p95": {"cpu": p95[0], "memory": p95[1]}, "p98": {"cpu": p98[0], "memory": p98[1]}}


# Koordinator's TestProdReclaimablePredictor_AddPod setting.
POD_MODEL = _model((500, 768 * MI), (1000, GI))
PREDICTIONS: dict[str, pred.Prediction] = {
    "__node-koord-prod__": _model((1000, GI), (1200, GI)),
    "__node-sys__": _model((300, 512 * MI), (500, 512 * MI)),
    "__node-__": {},
    "cold": POD_MODEL,
    "warm": POD_MODEL,
    "deleting": _model((0, 0), (0, 0)),
}
PODS = [
    _pod("cold", "1", "1Gi", age=dt.timedelta(minutes=1)),
    _pod("warm", "2", "2Gi"),
    _pod("deleting", "2", "2Gi", deleting=True, priority=None),
]


def _run(kind: str, node: kube.Node | None, pods: list[pred.PodFacts], **kw: Any) -> pred.Outcome:
    predictions = kw.pop("predictions", PREDICTIONS)
    kw.setdefault("cold_start_ns", HOUR_NS)
    predictor = pred.prod_predictor(kind, lookup=predictions.get, node=node, now_ns=NOW_NS, **kw)
    return pred.predict(predictor, pods)


# --- the predictors


@pytest.mark.parametrize(
    ("allocatable", "by_pod", "by_priority"),
    [
        # pod: only "warm" is predicted: peak 500m × 1.1 = 550m, 1Gi × 1.1 = 1181116006 → reclaimable 1450m and
        # 2Gi − 1181116006; allocatable − 550m / 1181116006 is larger.
        # priority: U = 1.1 × (300m + 1000m, 512Mi + 1Gi) = 1430m, 1771674009; request of cold + warm = 3, 3Gi.
        (("3", "3Gi"), (1450, 2 * GI - 1181116006), (3000 - 1430, 3 * GI - 1771674009)),
        (("8", "8Gi"), (1450, 2 * GI - 1181116006), (3000 - 1430, 3 * GI - 1771674009)),
        # A small node: allocatable − peak caps them (1000m − 550m, 1Gi − 1181116006 < 0 → 0; 1000m − 1430m → 0).
        (("1", "1Gi"), (450, 0), (0, 0)),
    ],
)
def test_pod_priority_and_min_predictors(
    allocatable: tuple[str, str], by_pod: tuple[int, int], by_priority: tuple[int, int]
) -> None:
    node = _node(*allocatable)
    pod_outcome = _run("pod", node, PODS)
    priority_outcome = _run("priority", node, PODS)
    both = _run("min", node, PODS)
    assert pod_outcome.reclaimable == {"cpu": by_pod[0], "memory": by_pod[1]}
    assert priority_outcome.reclaimable == {"cpu": by_priority[0], "memory": by_priority[1]}
    assert both.reclaimable == {"cpu": min(by_pod[0], by_priority[0]), "memory": min(by_pod[1], by_priority[1])}
    # Peaks: pod = 550m + the cold pod's request 1000m, 1181116006 + 1Gi; priority = U; min takes the larger.
    assert pod_outcome.peak == {"cpu": 1550, "memory": 1181116006 + GI}
    assert priority_outcome.peak == {"cpu": 1430, "memory": 1771674009}
    assert both.peak == {"cpu": 1550, "memory": 1181116006 + GI}
    assert not (pod_outcome.errors or both.errors or both.pod_errors)


def test_cold_start_is_inclusive_and_a_pod_without_creation_time_is_not_cold() -> None:
    exactly = _pod("warm", "2", "2Gi", age=dt.timedelta(hours=1))
    outcome = _run("pod", _node(), [exactly])
    assert outcome.peak == {"cpu": 2000, "memory": 2 * GI} and outcome.reclaimable == {"cpu": 0, "memory": 0}
    just_after = _pod("warm", "2", "2Gi", age=dt.timedelta(hours=1, microseconds=1))
    assert _run("pod", _node(), [just_after]).peak == {"cpu": 550, "memory": 1181116006}
    undated = just_after._replace(created_ns=None)
    assert _run("pod", _node(), [undated]).peak == {"cpu": 550, "memory": 1181116006}


@pytest.mark.parametrize(
    ("margin", "peak"),
    [(0, (500, GI)), (10, (550, 1181116006)), (25, (625, GI + GI // 4)), (-100, (0, 0))],
)
def test_safety_margin_scales_the_peak_and_truncates(margin: int, peak: tuple[int, int]) -> None:
    outcome = _run("pod", _node("8", "8Gi"), [PODS[1]], safety_margin_percent=margin)
    assert outcome.peak == {"cpu": peak[0], "memory": peak[1]}
    assert outcome.reclaimable == {"cpu": 2000 - peak[0], "memory": 2 * GI - peak[1]}


def test_priority_margin_applies_to_the_sum() -> None:
    # 300m + 1000m = 1300m, × 1.1 = 1430m; memory (512Mi + 1Gi) × 1.1 = 1771674009.6 → truncated.
    outcome = _run("priority", _node("8", "8Gi"), [])
    assert outcome.peak == {"cpu": 1430, "memory": 1771674009}
    assert outcome.reclaimable == {"cpu": 0, "memory": 0}  # nothing requested


@pytest.mark.parametrize("why", [{"deleting": True}, {"phase": "Succeeded"}, {"phase": "Failed"}])
def test_terminating_and_finished_pods_count_nothing(why: dict[str, Any]) -> None:
    gone = _pod("warm", "2", "2Gi", **why)
    for kind in ("pod", "priority"):
        outcome = _run(kind, _node("8", "8Gi"), [gone])
        assert outcome.reclaimable == {"cpu": 0, "memory": 0}
    assert _run("pod", _node(), [gone]).peak == {"cpu": 0, "memory": 0}
    # ... but a terminating pod still in cold start counts its request as unpredicted (cold start comes first).
    young = _pod("cold", "1", "1Gi", age=dt.timedelta(minutes=1), **why)
    assert _run("pod", _node(), [young]).peak == {"cpu": 1000, "memory": GI}


def test_only_prod_and_none_pods_are_reclaimable() -> None:
    batch = _pod("warm", "2", "2Gi", priority=5000)
    mid = _pod("warm", "2", "2Gi", priority=7000)
    for kind in ("pod", "priority", "min"):
        outcome = _run(kind, _node("8", "8Gi"), [batch, mid])
        assert outcome.reclaimable == {"cpu": 0, "memory": 0}
    assert _run("pod", _node(), [batch, mid]).peak == {"cpu": 0, "memory": 0}
    none_class = _pod("warm", "2", "2Gi", priority=100)  # "" by range, then koord-prod by its Burstable QoS
    assert none_class.priority_class == "koord-prod"


def test_a_pod_without_a_model_is_unpredicted_and_skips_the_priority_predictor() -> None:
    unknown = _pod("nobody", "1", "1Gi")
    outcome = _run("min", _node("8", "8Gi"), [unknown, PODS[1]])
    assert len(outcome.pod_errors) == 1
    assert "UID nobody not found in predict server" in outcome.pod_errors[0]
    assert "podReclaimablePredictor" in outcome.pod_errors[0]
    # pod: warm's peak + nobody's request; priority saw only warm: 2000 − 1430 = 570m, 2Gi − 1771674009.
    assert outcome.peak == {"cpu": 550 + 1000, "memory": max(1181116006 + GI, 1771674009)}
    assert outcome.reclaimable == {"cpu": 570, "memory": 2 * GI - 1771674009}


def test_a_uid_fed_twice_is_an_error_for_the_pod_predictor_only() -> None:
    outcome = _run("pod", _node("8", "8Gi"), [PODS[1], PODS[1]])
    assert outcome.pod_errors == ["pod ns/warm already exist in the pod reclaimable predictor"]
    assert outcome.reclaimable == {"cpu": 1450, "memory": 2 * GI - 1181116006}
    twice = _run("priority", _node("8", "8Gi"), [PODS[1], PODS[1]])
    assert twice.reclaimable == {"cpu": 4000 - 1430, "memory": 4 * GI - 1771674009}


def test_missing_node_fails_the_result_but_not_the_pod_peak() -> None:
    outcome = _run("min", None, [PODS[1]])
    assert outcome.reclaimable is None and "reclaimable" in outcome.errors
    assert outcome.peak == {"cpu": 1430, "memory": 1771674009}
    no_allocatable = kube.Node(status=kube.NodeStatus(allocatable=None))
    assert "allocation is nil" in _run("pod", no_allocatable, [PODS[1]]).errors["reclaimable"]


@pytest.mark.parametrize("missing", ["__node-sys__", "__node-koord-prod__", "__node-__"])
def test_a_missing_class_or_system_model_fails_the_priority_predictor(missing: str) -> None:
    predictions = {uid: p for uid, p in PREDICTIONS.items() if uid != missing}
    outcome = _run("min", _node(), [PODS[1]], predictions=predictions)
    assert outcome.reclaimable is None and outcome.peak is None
    assert missing in outcome.errors["reclaimable"] and missing in outcome.errors["peak"]
    assert _run("pod", _node(), [PODS[1]], predictions=predictions).errors == {}


def test_mid_batch_and_free_class_models_are_not_read() -> None:
    predictions = {**PREDICTIONS, "__node-koord-batch__": _model((9000, 9 * GI), (9000, 9 * GI))}
    assert _run("priority", _node(), [], predictions=predictions).peak == {"cpu": 1430, "memory": 1771674009}


@pytest.mark.parametrize(
    ("annotation", "allocatable"),
    [
        ('{"cpu": "2", "memory": "4Gi", "pods": "110"}', {"cpu": 2000, "memory": 4 * GI, "pods": 110}),
        ('{"cpu": 2, "memory": null}', {"cpu": 2000, "memory": 0}),
        ("{}", {}),
        ("null", {"cpu": 3000, "memory": 3 * GI}),
        ("not json", {"cpu": 3000, "memory": 3 * GI}),
        ('{"cpu": "lots"}', {"cpu": 3000, "memory": 3 * GI}),
        ('["cpu"]', {"cpu": 3000, "memory": 3 * GI}),
    ],
)
def test_raw_allocatable_annotation_wins_when_it_reads(annotation: str, allocatable: dict[str, int]) -> None:
    node = _node(annotations={pred.ANNOTATION_RAW_ALLOCATABLE: annotation})
    assert pred.node_allocatable(node) == allocatable


def test_raw_allocatable_caps_the_result() -> None:
    node = _node("8", "8Gi", annotations={pred.ANNOTATION_RAW_ALLOCATABLE: '{"cpu": "1", "memory": "1Gi"}'})
    assert _run("pod", node, [PODS[1]]).reclaimable == {"cpu": 450, "memory": 0}


def test_explain_names_what_happened_to_each_pod() -> None:
    predictor = pred.prod_predictor("min", lookup=PREDICTIONS.get, node=_node(), now_ns=NOW_NS, cold_start_ns=HOUR_NS)
    pred.predict(predictor, [*PODS, _pod("nobody", "1", "1Gi")])
    explained = predictor.explain()
    outcomes = {p["uid"]: p["outcome"] for p in explained["podReclaimablePredictor"]["pods"]}
    assert outcomes == {"cold": "cold start", "warm": "predicted", "deleting": "terminating", "nobody": "no model"}
    assert explained["priorityReclaimablePredictor"]["unReclaimable"] == {"cpu": 1430, "memory": 1771674009}


# --- training


def test_training_round_feeds_pods_classes_node_and_system() -> None:
    models = pred.Models()
    pods = [
        pred.PodUsage("a", "koord-prod", 1.0, 1 * GI),
        pred.PodUsage("b", "koord-prod", 0.5, 2 * GI),
        pred.PodUsage("c", "koord-batch", 2.0, 1 * GI),
    ]
    models.train(NOW_NS, pods, 4.0, 6.0 * GI)
    expected_uids = {"a", "b", "c", "__node__", "__node-sys__", "__node-__"} | {
        f"__node-koord-{c}__" for c in ("prod", "mid", "batch", "free")
    }
    assert set(models.models) == expected_uids

    def only_bucket(uid: str) -> tuple[int, int]:
        model = models.models[uid]
        return (model.cpu.min_bucket, model.memory.min_bucket)

    def bucket_of(cpu: float, memory: float) -> tuple[int, int]:
        return (hist.CPU_OPTIONS.find_bucket(cpu), hist.MEMORY_OPTIONS.find_bucket(memory))

    assert only_bucket("__node-koord-prod__") == bucket_of(1.5, 3 * GI)
    assert only_bucket("__node-koord-batch__") == bucket_of(2.0, 1 * GI)
    assert only_bucket("__node-koord-mid__") == bucket_of(0.0, 0.0) == (0, 0)
    assert only_bucket("__node-sys__") == bucket_of(4.0 - 3.5, 6.0 * GI - 4 * GI)
    assert only_bucket("__node__") == bucket_of(4.0, 6.0 * GI)
    # One sample of 1 core and 1 GiB: every percentile is the end of that sample's bucket.
    a = models.prediction("a")
    assert a is not None
    cpu_end = hist.CPU_OPTIONS.bucket_start(hist.CPU_OPTIONS.find_bucket(1.0) + 1)
    memory_end = hist.MEMORY_OPTIONS.bucket_start(hist.MEMORY_OPTIONS.find_bucket(GI) + 1)
    assert a == {name: {"cpu": int(cpu_end * 1000), "memory": int(memory_end)} for name in pred.PREDICTION_PERCENTILES}
    assert models.prediction("nobody") is None


def test_training_without_node_samples_leaves_the_node_model_and_clamps_the_system() -> None:
    models = pred.Models()
    models.train(NOW_NS, [pred.PodUsage("a", "", 1.0, GI)], None, 8.0 * GI)
    assert "__node__" not in models.models
    sys_model = models.models["__node-sys__"]
    # cpu: max(0 − 1, 0) = 0; memory: 8Gi − 1Gi.
    assert sys_model.cpu.min_bucket == 0
    assert sys_model.memory.min_bucket == hist.MEMORY_OPTIONS.find_bucket(7.0 * GI)
    assert models.models["__node-__"].cpu.min_bucket == hist.CPU_OPTIONS.find_bucket(1.0)


def test_models_not_trained_for_thirty_minutes_expire() -> None:
    models = pred.Models()
    models.train(NOW_NS, [pred.PodUsage("old", "koord-prod", 1.0, GI)], 2.0, 2.0 * GI)
    later = NOW_NS + 30 * 60 * pred.SECOND_NS
    models.train(later, [], 2.0, 2.0 * GI)
    assert models.expire(later) == []  # exactly 30 minutes: kept
    assert models.expire(later + 1) == ["old"]
    assert "__node-koord-prod__" in models.models


def test_no_part_of_a_model_is_tracked_by_the_cycle_collector() -> None:
    # The nodemetric service holds two million histograms at 10,000 nodes × 100 pods: every tracked part of a model
    # is scanned at each full collection, a stall of the event loop (an array.array weight store was one per
    # histogram). Values spread over many buckets, below and above the first, so the weight stores grow both ways.
    models = pred.Models()
    gc.collect()
    before = len(gc.get_objects())
    for minute in range(30):
        usages = [
            pred.PodUsage(
                f"pod-{k}", "koord-prod", 0.1 * (1 + (k + 3 * minute) % 40), float((1 + (k + minute) % 30) * GI)
            )
            for k in range(500)
        ]
        models.train(NOW_NS + minute * 60 * pred.SECOND_NS, usages, 300.0, 800.0 * GI)
    del usages
    parts = [
        part
        for model in models.models.values()
        for h in (model.cpu, model.memory)
        for part in (model, h, h._w, h.total, h.reference_ns, model.last_updated_ns)
    ]
    assert len(models.models) == 507 and max(len(m.cpu.weights) for m in models.models.values()) >= 20
    assert [part for part in parts if gc.is_tracked(part)] == []
    assert len({id(m.cpu.reference_ns) for m in models.models.values()}) == 1  # one int, not one per histogram
    del parts
    gc.collect()
    assert len(gc.get_objects()) - before < 50  # the dict of models, not the models


def test_decay_weighs_recent_rounds_more() -> None:
    # 12 hours (one CPU half-life) of 3 cores a minute, then an hour of 0.1 core. Undecayed the last hour would be
    # 60/780 = 7.7 % of the weight; decayed it is ∫₁₂¹³ 2^(t/12) / ∫₀¹³ 2^(t/12) = 0.119 / 1.119 = 10.6 %.
    models = pred.Models()
    plain = hist.Histogram(hist.CPU_OPTIONS)
    for minute in range(13 * 60):
        cores = 3.0 if minute < 12 * 60 else 0.1
        models.update("p", cores, 4.0 * GI, NOW_NS + minute * 60 * pred.SECOND_NS)
        plain.add(cores, 1.0)
    cpu = models.models["p"].cpu
    three_cores = hist.CPU_OPTIONS.bucket_start(hist.CPU_OPTIONS.find_bucket(3.0) + 1)
    tenth = hist.CPU_OPTIONS.bucket_start(hist.CPU_OPTIONS.find_bucket(0.1) + 1)
    assert cpu.percentile(0.09) == tenth and plain.percentile(0.09) == three_cores
    assert cpu.percentile(0.11) == three_cores
    prediction = models.prediction("p")
    assert prediction is not None
    assert prediction["p60"]["cpu"] == prediction["p95"]["cpu"] == prediction["max"]["cpu"] == int(three_cores * 1000)


@pytest.mark.parametrize(("values", "sample"), [([], None), ([3.0], 3.0), ([float(v) for v in range(1, 21)], 18.0)])
def test_training_sample_is_the_nearest_rank_p90(values: list[float], sample: float | None) -> None:
    assert pred.training_sample(values) == sample  # n = 20: float32(20) × float32(0.9) = 18 → the 18th smallest
