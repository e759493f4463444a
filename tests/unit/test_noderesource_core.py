"""services.noderesource.core: every branch of the batch (§2.4) and mid (§2.8) formulas, prepare (§2.5) and sync (§2.3).

Most cases start from the §2.6 worked example (100 cores / 400 GiB, kubelet reserves 2 cores / 8 GiB, system uses
3 cores / 10 GiB; prod pod A asks 40c/100Gi and uses 10c/60Gi, prod pod B asks 20c/40Gi with no metric yet, a
dangling prod metric C uses 2c/4Gi) and change one thing.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from schemas import koordinator, kube, nodemetric_json, quantity, vocab
from schemas.nodemetric_json import HostApplicationUsage, NodeUsageSnapshot, PodUsage
from services.noderesource import core
from services.noderesource.strategy import ColocationStrategy

NOW = 1_767_268_800.0  # 2026-01-01T12:00:00Z
GI = 1024**3
BATCH_CPU, BATCH_MEMORY, MID_CPU, MID_MEMORY = core.ALL_RESOURCES


def node(
    *,
    annotations: dict[str, str] | None = None,
    capacity: dict[str, Any] | None = None,
    allocatable: dict[str, Any] | None = None,
    with_allocatable: bool = True,
) -> kube.Node:
    status: dict[str, Any] = {"capacity": capacity or {"cpu": "100", "memory": "400Gi"}}
    if with_allocatable:
        status["allocatable"] = allocatable or {"cpu": "98", "memory": "392Gi"}
    return msgspec.convert({"metadata": {"name": "n", "annotations": annotations or {}}, "status": status}, kube.Node)


def pod(
    name: str,
    cpu: str,
    memory: str,
    *,
    priority: str = "koord-prod",
    qos: str | None = None,
    phase: str = "Running",
) -> kube.Pod:
    labels = {vocab.PRIORITY_CLASS_LABEL: priority}
    if qos is not None:
        labels[vocab.QOS_CLASS_LABEL] = qos
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "default", "labels": labels},
            "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
            "status": {"phase": phase, "qosClass": "Burstable"},
        },
        kube.Pod,
    )


def usage(name: str, cpu_cores: float, memory_gi: float, priority: str = "koord-prod") -> PodUsage:
    return PodUsage(
        namespace="default",
        name=name,
        usage={"cpu": int(cpu_cores * 1000), "memory": int(memory_gi * GI)},
        priority=priority,
    )


EXAMPLE_PODS = [pod("a", "40", "100Gi"), pod("b", "20", "40Gi")]
EXAMPLE_SUMMARIES = [kube.summarize_pod(p) for p in EXAMPLE_PODS]
EXAMPLE_METRICS = (usage("a", 10, 60), usage("c", 2, 4))


def metric(**changes: Any) -> NodeUsageSnapshot:
    base = NodeUsageSnapshot(
        update_time=NOW - 60,
        node_usage={"cpu": 15000, "memory": 74 * GI},
        system_usage={"cpu": 3000, "memory": 10 * GI},
        pods=EXAMPLE_METRICS,
    )
    return msgspec.structs.replace(base, **changes)


def strategy(**changes: Any) -> ColocationStrategy:
    return ColocationStrategy(enable=True, **changes)


def run(
    *,
    the_node: kube.Node | None = None,
    pods: list[kube.Pod] | None = None,
    snapshot: NodeUsageSnapshot | None = None,
    **strategy_changes: Any,
) -> core.NodeResourceResult:
    return core.calculate(
        the_node or node(),
        [kube.summarize_pod(p) for p in (EXAMPLE_PODS if pods is None else pods)],
        snapshot or metric(),
        strategy(**strategy_changes),
        NOW,
    )


# --- NodeMetric input


def test_nodemetric_object_becomes_integer_usage() -> None:
    document = {
        "metadata": {"name": "n"},
        "status": {
            "updateTime": "2026-01-01T11:59:00Z",
            "nodeMetric": {
                "nodeUsage": {"resources": {"cpu": "15500m", "memory": "74Gi", "nvidia.com/gpu": "1"}},
                "systemUsage": {},
                "aggregatedNodeUsages": [{"usage": {"p50": {}}, "duration": "5m0s"}],
            },
            "podsMetric": [{"namespace": "ns", "name": "p", "podUsage": {"resources": {"cpu": 2}}, "qos": "LS"}],
            "hostApplicationMetric": [
                {"name": "h", "usage": {"resources": {"memory": "1Gi"}}, "priority": "koord-prod"}
            ],
            "prodReclaimableMetric": {"resource": {}},
        },
    }
    snapshot = nodemetric_json.usage_snapshot(msgspec.convert(document, nodemetric_json.NodeMetricObject))
    assert snapshot.update_time == NOW - 60
    assert snapshot.node_usage == {"cpu": 15_500, "memory": 74 * GI}
    assert snapshot.system_usage == {}
    assert snapshot.pods == (PodUsage(namespace="ns", name="p", usage={"cpu": 2000}, qos="LS"),)
    assert snapshot.pods[0].key == "ns/p"
    assert snapshot.host_applications[0].usage == {"memory": GI}
    assert snapshot.prod_reclaimable is None  # a ResourceMap without `resources` is "no data"
    empty = nodemetric_json.usage_snapshot(nodemetric_json.NodeMetricObject())
    assert (empty.update_time, empty.node_usage, empty.pods) == (None, None, ())


# --- §2.6 worked example and the policies


def test_worked_example_usage_policy() -> None:
    result = run()
    assert result.values()[BATCH_CPU] == 25_000
    assert result.values()[BATCH_MEMORY] == 146 * GI
    cpu = result.resources[BATCH_CPU]
    assert cpu.terms["podsHPUsed"] == 32_000
    assert cpu.terms["podsHPRequest"] == 60_000
    assert cpu.terms["podsHPMaxUsedReq"] == 42_000  # B has no metric: not in max(usage, request)
    assert cpu.terms["systemUsedOrReserved"] == 3_000
    assert cpu.message == (
        f"{BATCH_CPU} 25000 = capacity 100000 − safetyMargin 40000 − systemUsedOrReserved 3000 − podsHPUsed 32000"
    )
    assert result.resources[BATCH_MEMORY].terms["podsHPMaxUsedReq"] == 104 * GI
    assert result.pods.high_priority_without_metric == 1 and result.pods.dangling_metrics_counted == 1


def test_memory_request_policy_uses_reservation_not_system_usage() -> None:
    memory = run(memory_calculate_policy="request").resources[BATCH_MEMORY]
    assert memory.value == 112 * GI  # 400 − 140 − 8 − 140
    assert memory.formula == "capacity − safetyMargin − nodeReserved − podsHPRequest"


def test_max_usage_request_policies() -> None:
    result = run(cpu_calculate_policy="maxUsageRequest", memory_calculate_policy="maxUsageRequest")
    assert result.values()[BATCH_CPU] == 15_000  # 100 − 40 − 3 − 42
    assert result.values()[BATCH_MEMORY] == 146 * GI  # 400 − 140 − 10 − 104


def test_request_policy_is_not_supported_for_cpu() -> None:
    cpu = run(cpu_calculate_policy="request").resources[BATCH_CPU]
    assert cpu.value == 25_000
    assert cpu.policy == "usage"


def test_results_are_clamped_at_zero() -> None:
    crowded = [pod("a", "40", "100Gi"), pod("b", "80", "400Gi")]
    result = run(pods=crowded)
    assert result.values()[BATCH_CPU] == 0
    assert result.resources[BATCH_CPU].message.startswith(f"{BATCH_CPU} 0 = max(capacity 100000")


def test_percent_caps() -> None:
    result = run(batch_cpu_threshold_percent=20, batch_memory_threshold_percent=50)
    assert result.values()[BATCH_CPU] == 20_000  # min(25000, 100000 × 20%)
    assert result.values()[BATCH_MEMORY] == 146 * GI  # below 200 GiB
    cpu = result.resources[BATCH_CPU]
    assert cpu.terms["uncapped"] == 25_000 and cpu.terms["cap"] == 20_000
    assert cpu.formula.startswith("min(") and "batchCPUThresholdPercent" in cpu.formula
    assert run(batch_memory_threshold_percent=30, memory_calculate_policy="request").values()[BATCH_MEMORY] == 112 * GI
    assert run(batch_memory_threshold_percent=25, memory_calculate_policy="request").values()[BATCH_MEMORY] == 100 * GI


def test_reclaim_percent_sets_the_safety_margin() -> None:
    result = run(cpu_reclaim_threshold_percent=65, memory_reclaim_threshold_percent=100)
    assert result.resources[BATCH_CPU].terms["safetyMargin"] == 35_000
    assert result.values()[BATCH_CPU] == 30_000
    assert result.values()[BATCH_MEMORY] == 286 * GI


# --- degrade and disable


@pytest.mark.parametrize(
    "snapshot",
    [None, metric(update_time=None), metric(update_time=NOW - 15 * 60 - 1)],
    ids=["no NodeMetric", "no updateTime", "stale"],
)
def test_missing_or_stale_nodemetric_removes_batch_and_mid(snapshot: NodeUsageSnapshot | None) -> None:
    result = core.calculate(node(), EXAMPLE_SUMMARIES, snapshot, strategy(), NOW)
    assert result.values() == dict.fromkeys(core.ALL_RESOURCES)
    assert result.resources[BATCH_CPU].reason == core.REASON_BATCH_DEGRADED
    assert result.resources[MID_MEMORY].reason == core.REASON_MID_DEGRADED


def test_degrade_boundary_and_custom_minutes() -> None:
    assert run(snapshot=metric(update_time=NOW - 15 * 60)).values()[BATCH_CPU] == 25_000  # not after the limit
    assert run(snapshot=metric(update_time=NOW - 120), degrade_time_minutes=1).values()[BATCH_CPU] is None


def test_disabled_removes_all_four() -> None:
    result = core.calculate(node(), EXAMPLE_SUMMARIES, metric(), ColocationStrategy(enable=False), NOW)
    assert result.values() == dict.fromkeys(core.ALL_RESOURCES)
    assert {item.reason for item in result.resources.values()} == {core.REASON_DISABLED}


# --- pod accounting


def test_lse_pods_hold_their_cpu_request() -> None:
    pods = [pod("a", "10", "10Gi", qos="LSE")]
    result = run(pods=pods, snapshot=metric(pods=(usage("a", 2, 20),)))
    cpu, memory = result.resources[BATCH_CPU], result.resources[BATCH_MEMORY]
    assert (cpu.terms["podsHPUsed"], memory.terms["podsHPUsed"]) == (10_000, 20 * GI)
    assert (cpu.terms["podsHPMaxUsedReq"], memory.terms["podsHPMaxUsedReq"]) == (10_000, 20 * GI)
    assert result.pods.high_priority_lse == 1


def test_pod_without_metric_counts_its_request_as_usage_only() -> None:
    result = run(pods=[pod("b", "20", "40Gi")], snapshot=metric(pods=()))
    cpu = result.resources[BATCH_CPU]
    assert (cpu.terms["podsHPUsed"], cpu.terms["podsHPRequest"], cpu.terms["podsHPMaxUsedReq"]) == (20_000, 20_000, 0)


def test_low_priority_pods_and_their_metrics_are_skipped() -> None:
    pods = [
        *EXAMPLE_PODS,
        pod("batch", "30", "30Gi", priority="koord-batch"),
        pod("free", "1", "1Gi", priority="koord-free"),
    ]
    metrics = (*EXAMPLE_METRICS, usage("batch", 25, 25, "koord-batch"), usage("free", 1, 1, "koord-free"))
    result = run(pods=pods, snapshot=metric(pods=metrics))
    assert result.values()[BATCH_CPU] == 25_000
    assert result.pods.low_priority_skipped == 2 and result.pods.dangling_metrics_counted == 1


def test_dangling_metrics_count_unless_low_priority() -> None:
    metrics = (*EXAMPLE_METRICS, usage("gone-batch", 7, 7, "koord-batch"), usage("gone-mid", 1, 1, "koord-mid"))
    result = run(snapshot=metric(pods=metrics))
    cpu = result.resources[BATCH_CPU]
    assert (cpu.terms["podsHPUsed"], cpu.terms["podsHPMaxUsedReq"]) == (33_000, 43_000)
    assert (result.pods.dangling_metrics_counted, result.pods.dangling_metrics_skipped) == (2, 1)


def test_finished_pods_are_skipped_but_their_metrics_stay_dangling() -> None:
    pods = [*EXAMPLE_PODS, pod("done", "50", "50Gi", phase="Succeeded")]
    metrics = (*EXAMPLE_METRICS, usage("done", 1, 1))
    result = run(pods=pods, snapshot=metric(pods=metrics))
    assert result.resources[BATCH_CPU].terms["podsHPRequest"] == 60_000
    assert result.resources[BATCH_CPU].terms["podsHPUsed"] == 33_000  # the metric counts as dangling
    assert result.pods.not_running_or_pending_skipped == 1


def test_koordinator_pods_in_multiple_priority_classes() -> None:
    """Koordinator's batchresource test "calculate with pods in multiple priority classes"."""
    gb = 10**9

    def k8s_pod(name: str, labels: dict[str, str], priority: int | None, phase: str, containers: int = 1) -> kube.Pod:
        container = {
            "resources": {"requests": {"cpu": "10", "memory": "10G"}, "limits": {"cpu": "10", "memory": "10G"}}
        }
        return msgspec.convert(
            {
                "metadata": {"name": name, "namespace": "test", "labels": labels},
                "spec": {"priority": priority, "containers": [container] * containers},
                "status": {"phase": phase},
            },
            kube.Pod,
        )

    pods = [
        k8s_pod("podProd", {vocab.QOS_CLASS_LABEL: "LS"}, None, "Running"),
        k8s_pod("podProd1", {}, 9999, "Running"),
        k8s_pod("podBatch", {vocab.QOS_CLASS_LABEL: "BE"}, None, "Running"),
        k8s_pod("podMid", {vocab.QOS_CLASS_LABEL: "BE"}, 7000, "Pending", containers=2),
        k8s_pod("podProd2", {}, None, "Succeeded"),
    ]
    metrics = tuple(
        PodUsage(namespace="test", name=name, usage={"cpu": cores * 1000, "memory": cores * gb})
        for name, cores in (("podProd", 5), ("podProd1", 6), ("podBatch", 10), ("podMid", 22))
    )
    snapshot = NodeUsageSnapshot(update_time=NOW, system_usage={"cpu": 7000, "memory": 12 * gb}, pods=metrics)
    the_node = node(capacity={"cpu": "100", "memory": "120G"}, allocatable={"cpu": "100", "memory": "120G"})
    result = core.calculate(
        the_node,
        [kube.summarize_pod(p) for p in pods],
        snapshot,
        strategy(cpu_reclaim_threshold_percent=65, memory_reclaim_threshold_percent=65),
        NOW,
    )
    assert result.values()[BATCH_CPU] == 25_000
    assert result.values()[BATCH_MEMORY] == 33 * gb


# --- reservation and host applications


def _reservation(**body: Any) -> dict[str, str]:
    return {koordinator.ANNOTATION_NODE_RESERVATION: json.dumps(body)}


def test_reservation_annotation_beats_a_smaller_kubelet_reservation() -> None:
    annotated = node(annotations=_reservation(resources={"cpu": "5", "memory": "20Gi"}))
    result = run(the_node=annotated, memory_calculate_policy="request")
    assert result.resources[BATCH_CPU].terms["nodeReserved"] == 5_000
    assert result.values()[BATCH_CPU] == 23_000  # max(system 3, reserved 5) = 5
    assert result.values()[BATCH_MEMORY] == 100 * GI  # 400 − 140 − 20 − 140


def test_kubelet_reservation_beats_a_smaller_annotation() -> None:
    annotated = node(annotations=_reservation(resources={"cpu": "1", "memory": "1Gi"}))
    assert run(the_node=annotated, memory_calculate_policy="request").values()[BATCH_MEMORY] == 112 * GI


def test_reserved_cpus_count_overrides_the_cpu_quantity() -> None:
    annotated = node(annotations=_reservation(resources={"cpu": "1"}, reservedCPUs="0-3,8"))
    result = run(the_node=annotated)
    assert result.resources[BATCH_CPU].terms["nodeReserved"] == 5_000
    assert koordinator.node_reservation_resources(annotated.metadata.annotations) == {"cpu": 5_000}


@pytest.mark.parametrize("text", ["not json", "[]", '{"reservedCPUs": "0-x"}', '{"resources": {"cpu": "lots"}}'])
def test_unreadable_reservation_is_ignored(text: str) -> None:
    annotated = node(annotations={koordinator.ANNOTATION_NODE_RESERVATION: text})
    assert koordinator.node_reservation_resources(annotated.metadata.annotations) is None
    assert run(the_node=annotated).resources[BATCH_CPU].terms["nodeReserved"] == 2_000


@pytest.mark.parametrize(
    ("text", "count"),
    [("0", 1), ("0-3", 4), ("0-3,2-5", 6), ("5-3", 0), ("0-4096", 4097), ("0-4097", None), ("1,", None), ("a", None)],
)
def test_count_cpuset(text: str, count: int | None) -> None:
    assert koordinator.count_cpuset(text) == count


def test_host_applications_above_batch_count_as_system_usage() -> None:
    apps = (
        HostApplicationUsage(name="prod-agent", usage={"cpu": 2000, "memory": GI}, priority="koord-prod"),
        HostApplicationUsage(name="mid-agent", usage={"cpu": 1000, "memory": GI}, priority="koord-mid"),
        HostApplicationUsage(name="yarn", usage={"cpu": 9000, "memory": 9 * GI}, priority="koord-batch"),
        HostApplicationUsage(name="other", usage={"cpu": 9000, "memory": 9 * GI}, priority=""),
    )
    result = run(snapshot=metric(host_applications=apps))
    assert result.resources[BATCH_CPU].terms["systemUsed"] == 6_000
    assert result.values()[BATCH_CPU] == 22_000
    assert core.host_apps_used_above(metric(host_applications=apps), vocab.PRIORITY_MID) == {
        "cpu": 2000,
        "memory": GI,
    }


# --- mid


def test_mid_static_mode() -> None:
    result = run(mid_reclaim_mode="static", mid_static_cpu_reserved_percent=10, mid_static_memory_reserved_percent=20)
    assert result.values()[MID_CPU] == 10_000
    assert result.values()[MID_MEMORY] == 80 * GI
    capped = run(mid_reclaim_mode="static", mid_static_cpu_reserved_percent=10, mid_cpu_threshold_percent=5)
    assert capped.values()[MID_CPU] == 5_000


def test_mid_default_mode() -> None:
    snapshot = metric(prod_reclaimable={"cpu": 20_000, "memory": 50 * GI})
    result = run(snapshot=snapshot, mid_unallocated_percent=50, mid_cpu_threshold_percent=30)
    cpu, memory = result.resources[MID_CPU], result.resources[MID_MEMORY]
    # reserved max(kubelet 2c/8Gi, system 3c/10Gi); unallocated = 100 − 3 − 60 = 37c, 400 − 10 − 140 = 250Gi
    assert (cpu.terms["unallocated"], memory.terms["unallocated"]) == (37_000, 250 * GI)
    assert (cpu.terms["nodeUnused"], memory.terms["nodeUnused"]) == (85_000, 326 * GI)
    assert cpu.value == 30_000  # min(20 + 18.5, 100 × 30%)
    assert memory.value == 175 * GI  # 50 + 125
    assert cpu.note == ""


def test_mid_ignores_mid_and_lower_pods_and_counts_only_prod_host_apps() -> None:
    pods = [*EXAMPLE_PODS, pod("m", "30", "30Gi", priority="koord-mid"), pod("x", "5", "5Gi", phase="Failed")]
    apps = (HostApplicationUsage(name="mid-agent", usage={"cpu": 9000, "memory": 90 * GI}, priority="koord-mid"),)
    result = run(pods=pods, snapshot=metric(host_applications=apps), mid_unallocated_percent=100)
    assert result.resources[MID_CPU].terms["prodAllocated"] == 60_000
    assert result.values()[MID_CPU] == 37_000


def test_mid_without_node_usage_counts_nothing_unused() -> None:
    snapshot = metric(prod_reclaimable={"cpu": 20_000, "memory": 50 * GI}, node_usage={"cpu": 15_000})
    result = run(snapshot=snapshot, mid_unallocated_percent=10)
    assert result.values()[MID_CPU] == 3_700  # 0 + 37000 × 10%
    assert "nodeUsage" in result.resources[MID_CPU].note


def test_mid_without_prod_reclaimable_counts_zero() -> None:
    result = run()
    assert result.values()[MID_CPU] == 0 and result.values()[MID_MEMORY] == 0
    assert "prodReclaimableMetric" in result.resources[MID_CPU].note


def test_mid_is_removed_when_the_node_has_no_allocatable() -> None:
    result = run(the_node=node(with_allocatable=False))
    assert result.values()[MID_CPU] is None and result.resources[MID_CPU].reason == core.REASON_NO_ALLOCATABLE
    # Koordinator's kubelet reservation is capacity − allocatable: with no allocatable, all of the capacity
    assert result.values()[BATCH_CPU] == 0


# --- prepare


def _prepared(annotations: dict[str, str] | None = None, **strategy_changes: Any) -> core.NodeResourcePatch:
    the_node = node(annotations=annotations)
    return core.prepare(the_node, run(the_node=the_node, **strategy_changes))


def test_prepare_writes_values_and_the_origin_annotation() -> None:
    patch = _prepared()
    assert patch.resources == {BATCH_CPU: 25_000, BATCH_MEMORY: 146 * GI, MID_CPU: 0, MID_MEMORY: 0}
    assert patch.annotations == {
        koordinator.ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE: (
            '{"resources":{"kubernetes.io/batch-cpu":"25k","kubernetes.io/batch-memory":"146Gi"}}'
        )
    }


@pytest.mark.parametrize(("ratio", "expected"), [("1.2", 30_000), ("1.15", 28_750), ("1.0", 25_000), ("0.8", 25_000)])
def test_cpu_normalization_ratio_scales_batch_cpu_and_rounds_up(ratio: str, expected: int) -> None:
    patch = _prepared({koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO: ratio})
    assert patch.resources[BATCH_CPU] == expected
    assert patch.resources[MID_CPU] == 0  # only batch-cpu is scaled


@pytest.mark.parametrize("ratio", ["", "fast", " 1.2", "1_2", "inf", "NaN"])
def test_unreadable_normalization_ratio_is_ignored(ratio: str) -> None:
    assert _prepared({koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO: ratio}).resources[BATCH_CPU] == 25_000


def test_explicit_normalization_ratio_overrides_the_annotation() -> None:
    the_node = node(annotations={koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO: "2"})
    patch = core.prepare(the_node, run(the_node=the_node), cpu_normalization_ratio="1.2")
    assert patch.resources[BATCH_CPU] == 30_000


def _third_party(*allocations: dict[str, Any]) -> dict[str, str]:
    return {koordinator.ANNOTATION_THIRD_PARTY_ALLOCATIONS: json.dumps({"allocations": list(allocations)})}


def test_third_party_batch_allocations_are_subtracted_after_the_origin_is_recorded() -> None:
    annotations = _third_party(
        {"name": "yarn", "priority": "koord-batch", "resources": {BATCH_CPU: "10000", BATCH_MEMORY: "10Gi"}},
        {"name": "other", "priority": "koord-prod", "resources": {BATCH_CPU: "99999"}},
    )
    patch = _prepared(annotations)
    assert (patch.resources[BATCH_CPU], patch.resources[BATCH_MEMORY]) == (15_000, 136 * GI)
    assert '"kubernetes.io/batch-cpu":"25k"' in patch.annotations[koordinator.ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE]
    over = _prepared(_third_party({"name": "y", "priority": "koord-batch", "resources": {BATCH_CPU: "90000"}}))
    assert over.resources[BATCH_CPU] == 0


def test_removed_batch_records_zero_origin_and_skips_third_party() -> None:
    annotations = _third_party({"name": "yarn", "priority": "koord-batch", "resources": {BATCH_CPU: "10000"}})
    the_node = node(annotations=annotations)
    result = core.calculate(the_node, EXAMPLE_SUMMARIES, None, strategy(), NOW)
    patch = core.prepare(the_node, result)
    assert patch.resources == dict.fromkeys(core.ALL_RESOURCES)
    assert patch.annotations[koordinator.ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE] == (
        '{"resources":{"kubernetes.io/batch-cpu":"0","kubernetes.io/batch-memory":"0"}}'
    )


def test_origin_annotation_keeps_other_entries_and_unreadable_allocations_are_ignored() -> None:
    annotations = {
        koordinator.ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE: '{"resources":{"kubernetes.io/mid-cpu":"1000"}}',
        koordinator.ANNOTATION_THIRD_PARTY_ALLOCATIONS: '{"allocations": [{"name": "y", "resources": {"cpu": "x"}}]}',
    }
    patch = _prepared(annotations)
    assert patch.resources[BATCH_CPU] == 25_000
    assert patch.annotations[koordinator.ANNOTATION_ORIGIN_EXTENDED_ALLOCATABLE] == (
        '{"resources":{"kubernetes.io/batch-cpu":"25k","kubernetes.io/batch-memory":"146Gi",'
        '"kubernetes.io/mid-cpu":"1k"}}'
    )


def test_apply_patch() -> None:
    patch = core.NodeResourcePatch(resources={BATCH_CPU: 5, BATCH_MEMORY: None}, annotations={})
    assert core.apply_patch({"cpu": 1, BATCH_MEMORY: 9}, patch) == {"cpu": 1, BATCH_CPU: 5}


# --- sync


@pytest.mark.parametrize(
    ("old", "new", "diff"),
    [
        ({}, {}, False),
        ({BATCH_CPU: 1000}, {}, True),
        ({}, {BATCH_CPU: 0}, True),
        ({BATCH_CPU: 0}, {BATCH_CPU: 0}, False),
        ({BATCH_CPU: 0}, {BATCH_CPU: 1}, True),
        ({BATCH_CPU: 1000}, {BATCH_CPU: 1100}, False),  # exactly 10%: not more than
        ({BATCH_CPU: 1000}, {BATCH_CPU: 1101}, True),
        ({BATCH_CPU: 1000}, {BATCH_CPU: 899}, True),
        ({BATCH_MEMORY: 100 * GI}, {BATCH_MEMORY: 109 * GI}, False),
    ],
)
def test_is_resource_diff(old: dict[str, int], new: dict[str, int], diff: bool) -> None:
    name = next(iter(old or new), BATCH_CPU)
    assert core.is_resource_diff(old, new, name, 0.1) is diff


def test_needs_sync() -> None:
    current = {BATCH_CPU: 25_000, BATCH_MEMORY: 146 * GI}
    rules = strategy()
    assert core.needs_sync(current, current, strategy=rules, last_synced_at=None, now=NOW).needed
    assert core.needs_sync(current, current, strategy=rules, last_synced_at=NOW - 301, now=NOW).needed
    fresh = core.needs_sync(current, current, strategy=rules, last_synced_at=NOW - 300, now=NOW)
    assert not fresh.needed and fresh.reason == "up to date"
    moved = core.needs_sync(current, {**current, MID_CPU: 1}, strategy=rules, last_synced_at=NOW, now=NOW)
    assert moved.needed and MID_CPU in moved.reason


@given(
    name=st.sampled_from(core.ALL_RESOURCES),
    amount=st.integers(min_value=0, max_value=2**62) | st.integers(min_value=0, max_value=10**6),
)
def test_milli_value_is_the_quantity_round_trip(name: str, amount: int) -> None:
    written = quantity.parse_quantity(quantity.format_amount(name, amount))
    assert core.milli_value(amount) == quantity.milli_value(written)
