"""One node's state as a document (services.loadaware.snapshot): read as `koordbus calc loadaware` reads it, the
node's cache as Koordinator's podAssignCache holds it, and export → read giving back the live answer."""

from __future__ import annotations

import json
import random
from typing import Any

import msgspec
import pytest

from schemas.node import ResourceMap
from services.common import watermarks
from services.common.args import ArgsError
from services.loadaware import core, estimator, snapshot, state
from services.loadaware.args import LoadAwareArgs, apply_watermarks, with_defaults
from services.loadaware.state import LoadState
from tests.support.loadaware import GI, node, node_json, pod, pod_json, report

NOW = "2026-06-01T12:00:00Z"
T = 1_780_315_200.0  # NOW in unix seconds
PROD = {"koordinator.sh/priority-class": "koord-prod"}


def scheduled(at: str) -> list[dict[str, str]]:
    return [{"type": "PodScheduled", "status": "True", "lastTransitionTime": at}]


def document(**changes: Any) -> dict[str, Any]:
    """32 cores / 128 GiB using 12 cores / 64 GiB 10 s ago, with a few assigned pods, and an incoming pod."""
    doc: dict[str, Any] = {
        "now": NOW,
        "args": {"estimatedSecondsAfterPodScheduled": 120},
        "node": node_json("n1"),
        "nodeMetric": {
            "spec": {"metricCollectPolicy": {"reportIntervalSeconds": 60}},
            "status": {
                "updateTime": "2026-06-01T11:59:50Z",
                "nodeMetric": {
                    "nodeUsage": {"resources": {"cpu": "12", "memory": "64Gi"}},
                    "aggregatedNodeUsages": [
                        {"duration": "5m0s", "usage": {"p95": {"resources": {"cpu": "20", "memory": "70Gi"}}}},
                        {"duration": "30m0s", "usage": {"p95": {"resources": {"cpu": "22", "memory": "71Gi"}}}},
                    ],
                },
                "podsMetric": [
                    {
                        "namespace": "default",
                        "name": "old",
                        "priority": "koord-prod",
                        "podUsage": {"resources": {"cpu": "2", "memory": "4Gi"}},
                    },
                    {"namespace": "default", "name": "fresh", "podUsage": {}},
                    None,
                ],
            },
        },
        "assignedPods": [
            {
                "pod": pod_json(
                    "old",
                    cpu="4",
                    memory="8Gi",
                    labels=PROD,
                    node_name="n1",
                    conditions=scheduled("2026-06-01T10:00:00Z"),
                )
            },
            {"pod": pod_json("fresh", cpu="2", node_name="n1"), "assignedAt": "2026-06-01T11:59:58.25Z"},
            {"pod": pod_json("done", cpu="2", node_name="n1", phase="Succeeded")},
            {"pod": pod_json("elsewhere", cpu="2", node_name="n2")},
            {
                "pod": pod_json(
                    "placeholder",
                    cpu="2",
                    node_name="n1",
                    annotations={"scheduling.koordinator.sh/reserve-pod": "true"},
                )
            },
            {"pod": pod_json("idle", cpu="1", node_name="n1", labels={"koordinator.sh/priority-class": "koord-free"})},
        ],
        "pod": pod_json("web", cpu="4", memory="8Gi", limit_cpu="4", limit_memory="8Gi"),
    }
    return doc | changes


def decide(doc: dict[str, Any]) -> dict[str, Any]:
    load, name, now = snapshot.read(snapshot.decode(json.dumps(doc)))
    incoming = msgspec.convert(doc["pod"], type(pod("x")))
    return snapshot.decide(load, name, incoming, now=now)


def test_the_cache_holds_what_koordinators_pod_assign_cache_holds() -> None:
    out = decide(document())
    cache = out["cache"]
    assert [p["pod"] for p in cache["pods"]] == ["default/fresh", "default/idle", "default/old"]
    fresh, idle, old = cache["pods"]
    # no PodScheduled condition: assignedAt dates it; the args' 120 s window runs from there
    assert fresh == {
        "pod": "default/fresh",
        "timestamp": "2026-06-01T11:59:58.25Z",
        "estimated": {"cpu": 1700, "memory": 200 * 1024 * 1024},
        "estimatedDeadline": "2026-06-01T12:01:58.25Z",
    }
    assert idle["estimated"] is None  # koord-free: nothing to estimate
    assert (old["timestamp"], old["estimatedDeadline"]) == ("2026-06-01T10:00:00Z", "2026-06-01T10:02:00Z")
    assert cache["nodeUsage"] == {"cpu": 12000, "memory": 64 * GI}
    # old is reported (usage 2000 / 4 GiB) and was assigned long before: only fresh (its metric has no usage) is new
    assert cache["nodeDelta"] == {"cpu": 1700, "memory": 200 * 1024 * 1024}
    assert cache["nodeDeltaPods"] == ["default/fresh"]
    assert cache["nodeEstimated"] == {"cpu": 1700 + 3400, "memory": 200 * 1024 * 1024 + round(8 * GI * 0.7)}
    assert cache["nodeEstimatedPods"] == ["default/fresh", "default/old"]
    # old is prod and reported so (its usage is prod usage); fresh is prod too (Burstable → LS), not reported
    assert cache["prodUsage"] == {"cpu": 2000, "memory": 4 * GI}
    assert (cache["prodDelta"], cache["prodDeltaPods"]) == (cache["nodeDelta"], ["default/fresh"])
    assert cache["aggUsages"] == {
        "p95": {
            "0": {"cpu": 22000, "memory": 71 * GI},
            "300": {"cpu": 20000, "memory": 70 * GI},
            "1800": {"cpu": 22000, "memory": 71 * GI},
        }
    }
    assert (cache["updateTime"], cache["reportIntervalSeconds"]) == ("2026-06-01T11:59:50Z", 60)
    # (12000 + 1700 + 3400) / 32000 = 53% ≤ 65; memory (64 GiB + 200 MiB + 5.6 GiB) / 128 GiB = 55% ≤ 95
    assert out["filter"] == {"status": "Success", "reason": ""}
    assert out["estimated"]["filter"] == {"cpu": 17100, "memory": 64 * GI + 200 * 1024 * 1024 + round(8 * GI * 0.7)}
    assert out["score"] == (46 + 45) // 2


def test_a_later_entry_of_the_same_pod_replaces_the_earlier_one() -> None:
    doc = document()
    again = {"pod": pod_json("fresh", cpu="2", node_name="n1"), "assignedAt": "2026-06-01T11:59:59Z"}
    gone = {"pod": pod_json("old", cpu="4", node_name="n1", phase="Failed")}
    doc["assignedPods"] += [again, gone]
    pods = decide(doc)["cache"]["pods"]
    assert [(p["pod"], p["timestamp"]) for p in pods] == [
        ("default/fresh", "2026-06-01T11:59:59Z"),  # not the first sighting: the later entry is the pod
        ("default/idle", "2026-06-01T12:00:00Z"),  # no assignedAt: now
    ]


def test_resource_maps_inline_or_under_resources_read_alike() -> None:
    doc = document()
    flat = json.loads(json.dumps(doc).replace('{"resources": ', '{"x": 0, "resources": '))  # still wire form
    inline = document()
    inline["nodeMetric"]["status"]["nodeMetric"]["nodeUsage"] = {"cpu": "12", "memory": "64Gi"}
    inline["nodeMetric"]["status"]["podsMetric"][0]["podUsage"] = {"cpu": "2", "memory": "4Gi"}
    for usage in inline["nodeMetric"]["status"]["nodeMetric"]["aggregatedNodeUsages"]:
        usage["usage"] = {kind: rm["resources"] for kind, rm in usage["usage"].items()}
    assert decide(inline) == decide(doc) == decide(flat)


def test_a_nodemetric_without_status_nodemetric_passes_with_score_zero() -> None:
    doc = document()
    del doc["nodeMetric"]["status"]["nodeMetric"]
    out = decide(doc)
    assert out["filter"] == {"status": "Success", "reason": ""} and out["score"] == 0
    assert out["estimated"] == {"filter": None, "score": None}
    assert out["cache"]["nodeUsage"] is None and out["cache"]["aggUsages"] == {}


def test_a_nodemetric_without_update_time_is_expired() -> None:
    doc = document()
    del doc["nodeMetric"]["status"]["updateTime"]
    out = decide(doc)
    assert out["filter"] == {"status": "Unschedulable", "reason": core.REASON_EXPIRED} and out["score"] == 0
    assert out["cache"]["updateTime"] == snapshot.GO_ZERO_TIME
    # Go's zero time: every estimate is new
    assert out["cache"]["nodeDeltaPods"] == ["default/fresh", "default/old"]


def test_without_a_nodemetric_the_cache_has_only_pods() -> None:
    out = decide(document(nodeMetric=None))
    assert out["filter"]["status"] == "Success" and out["score"] == 0
    assert len(out["cache"]["pods"]) == 3 and out["cache"]["nodeDelta"] is None


def test_rejected_args_and_malformed_documents() -> None:
    with pytest.raises(ArgsError, match=r"resourceWeights\.cpu: 0"):
        decide(document(args={"resourceWeights": {"cpu": 0}}))
    bad = document()
    bad["nodeMetric"]["status"]["nodeMetric"]["aggregatedNodeUsages"][0]["duration"] = "five minutes"
    with pytest.raises(snapshot.SnapshotError, match=r"aggregatedNodeUsages\[0\]\.duration"):
        decide(bad)
    bad = document()
    bad["nodeMetric"]["status"]["nodeMetric"]["nodeUsage"] = {"cpu": "lots"}
    with pytest.raises(snapshot.SnapshotError, match=r"\$\.nodeMetric\.status\.nodeMetric\.nodeUsage\.resources\.cpu"):
        decide(bad)


def test_times_are_read_to_the_nanosecond_and_written_as_given() -> None:
    assert snapshot.parse_time(NOW, "$") == T and snapshot.format_time(T) == NOW
    for text in ("2026-06-01T12:00:00.5Z", "2026-06-01T12:00:00.123456Z", "2026-06-01T11:59:59.000001Z"):
        assert snapshot.format_time(snapshot.parse_time(text, "$")) == text
    assert snapshot.parse_time("2026-06-01T14:00:00.25+02:00", "$") == T + 0.25
    assert snapshot.format_time(-62135596800.0) == snapshot.GO_ZERO_TIME
    # a clock's float (time.time()) is written with the digits that read back to the very same float
    clock = 1_795_717_567.1823108
    assert snapshot.parse_time(snapshot.format_time(clock), "$") == clock
    with pytest.raises(snapshot.SnapshotError, match=r"\$\.now: 'noon' is not an RFC 3339 time"):
        snapshot.parse_time("noon", "$.now")


# --- export → read


def random_state(rng: random.Random, args: LoadAwareArgs, config: watermarks.WatermarkConfig | None) -> LoadState:
    load = LoadState(args, config)
    for i in range(6):
        name = f"n{i}"
        annotations = {}
        if rng.random() < 0.3:
            annotations[state.ANNOTATION_USAGE_THRESHOLDS] = json.dumps(
                rng.choice(
                    [
                        {"usageThresholds": {"cpu": rng.randint(10, 90)}},
                        {"prodUsageThresholds": {"memory": 50}},
                        {"aggregatedUsage": {"usageThresholds": {"cpu": 40}, "usageAggregationType": "p95",
                                             "usageAggregatedDuration": rng.choice(["5m", "1.5s", "0s"])}},
                    ]
                )
            )  # fmt: skip
        if rng.random() < 0.3:
            annotations[estimator.ANNOTATION_RAW_ALLOCATABLE] = json.dumps({"cpu": str(rng.choice([8, 16]))})
        if rng.random() < 0.9:
            labels = {"pool": rng.choice(["a", "b"])}
            load.apply_node(name, node(name, cpu=str(rng.choice([16, 32])), annotations=annotations, labels=labels))
        keys = [f"p{i}-{j}" for j in range(rng.randint(0, 6))]
        reported = {f"default/{k}": (rng.randint(0, 3000), rng.randint(0, 4) * GI) for k in keys if rng.random() < 0.6}
        prod = frozenset(k for k in reported if rng.random() < 0.5)
        if rng.random() < 0.85:
            event = report(
                name,
                at=T - rng.choice([5, 30, 179, 400]),
                cpu=rng.randint(0, 30000),
                memory=rng.randint(0, 120) * GI,
                pods=reported,
                prod_pods=prod,
                system=(rng.randint(0, 500), GI),
                aggregated={300: {"p95": (rng.randint(0, 30000), GI)}, 1800: {"avg": (rng.randint(0, 9000), GI)}}
                if rng.random() < 0.7
                else None,
            )
            if rng.random() < 0.2:  # our report without node usage: "no data"
                info = msgspec.structs.replace(event.status.node_metric, node_usage=ResourceMap())
                event = msgspec.structs.replace(event, status=msgspec.structs.replace(event.status, node_metric=info))
            load.apply_metric(event)
        for key in keys:
            labels = PROD if rng.random() < 0.5 else {"koordinator.sh/qosClass": rng.choice(["BE", "LS"])}
            annotations = {}
            if rng.random() < 0.3:
                annotations[estimator.ANNOTATION_AFTER_SCHEDULED] = str(rng.choice([30, 600, -1]))
                annotations[estimator.ANNOTATION_SCALING_FACTORS] = json.dumps({"cpu": rng.randint(1, 120)})
            conditions = scheduled(snapshot.format_time(T - rng.choice([20, 3600]))) if rng.random() < 0.5 else None
            body = pod_json(
                key,
                cpu=str(rng.randint(1, 4)),
                memory=f"{rng.randint(0, 4)}Gi",
                labels=labels,
                annotations=annotations,
                node_name=name,
                conditions=conditions,
                phase="Running",
            )
            seen = T - rng.choice([1, 50, 100, 3600]) + rng.random()
            if rng.random() < 0.2:  # placed by the bind verb, before the watch shows it: the pod as filter saw it
                body["spec"].pop("nodeName")
                placed = state.assigned_pod(msgspec.convert(body, type(pod("x"))), seen_at=seen, args=args)
                load.assume(f"default/{key}", placed, node=name, bound=True, assumed_at=seen)
                continue
            load.apply_pod(f"default/{key}", msgspec.convert(body, type(pod("x"))), node=name, seen_at=seen)
            if rng.random() < 0.2:  # seen again later: the first sighting stays its assign time
                load.apply_pod(f"default/{key}", msgspec.convert(body, type(pod("x"))), node=name, seen_at=seen + 7)
    return load


ARGS = [
    LoadAwareArgs(),
    LoadAwareArgs(prod_usage_thresholds={"cpu": 40, "memory": 60}, score_according_prod_usage=True),
    LoadAwareArgs(
        aggregated=None,
        dominant_resource_weight=2,
        resource_weights={"cpu": 2},
        estimated_seconds_after_initialized=60,
        estimated_seconds_after_pod_scheduled=300,
        allow_customize_estimation=True,
        prod_usage_include_sys=True,
    ),
    LoadAwareArgs(filter_expired_node_metrics=False, usage_thresholds={"memory": 70}),
]
QOS = {
    "resource-threshold-config": json.dumps(
        {
            "clusterStrategy": {
                "enable": True,
                "memoryEvictThresholdPercent": 70,
                "evictEnabledPriorityThreshold": 8000,
            },
            "nodeStrategies": [{"nodeSelector": {"matchLabels": {"pool": "b"}}, "memoryEvictThresholdPercent": 40}],
        }
    )
}


@pytest.mark.parametrize("seed", range(8))
def test_export_then_read_answers_as_the_live_state(seed: int) -> None:
    rng = random.Random(seed)
    config = watermarks.read_watermarks(QOS) if seed % 2 else None
    args = with_defaults(ARGS[seed % len(ARGS)])
    if seed == 5:  # the ConfigMap's watermarks empty the thresholds
        args = apply_watermarks(args, watermarks.Watermarks(usage_thresholds={}))
    live = random_state(rng, args, config)
    incoming = [
        pod("web", cpu="4", memory="8Gi"),
        pod("api", cpu="2", memory="1Gi", labels=PROD),
        pod("be", cpu="1", memory="12Gi", labels={"koordinator.sh/qosClass": "BE"}),
        pod("ds", cpu="1", owner_kind="DaemonSet"),
    ]
    for name in list(live.nodes):
        exported = snapshot.export(live, name, now=T)
        assert exported is not None
        replayed, replayed_name, now = snapshot.read(snapshot.decode(json.dumps(exported)))
        assert (replayed_name, now) == (name, T)
        assert snapshot.cache(replayed, name) == snapshot.cache(live, name)
        for candidate in incoming:
            assert core.explain(replayed, candidate, name, now=T) == core.explain(live, candidate, name, now=T)
    assert snapshot.export(live, "ghost", now=T) is None


def test_an_exported_state_without_qos_has_no_node_qos_and_others_carry_their_strategy() -> None:
    load = LoadState(with_defaults(LoadAwareArgs()), watermarks.read_watermarks(QOS))
    load.apply_node("a", node("a", labels={"pool": "b"}))
    exported = snapshot.export(load, "a", now=T)
    assert (
        exported is not None and exported["nodeQoS"]["resourceThresholdStrategy"]["memoryEvictThresholdPercent"] == 40
    )
    assert "nodeQoS" not in (snapshot.export(LoadState(with_defaults(LoadAwareArgs())), "a", now=T) or {"x": 1})
