"""services.noderesource.numa and schemas.topology: NUMA-level batch resources (spec §2.7), every branch.

The worked example is §2.6 on two NUMA zones: node 100 cores / 400 GiB, kubelet reserves 2 cores / 8 GiB, the NRT
lists zones node-0 and node-1 with 49 cores / 196 GiB allocatable each, system uses 3 cores / 10 GiB. Prod pod A
asks 40c/100Gi, uses 10c/60Gi and is allocated on NUMA 0; prod pod B asks 20c/40Gi, has no metric and no
allocation (split across both zones); a dangling prod metric C uses 2c/4Gi (split). Per zone: safety margin
49000 × 0.4 = 19600 millicores and 196Gi × 0.35 = 73658689126.4 → 73658689126 bytes; system used 1500 / 5Gi;
reserved 1000 / 4Gi.

zone 0: podsHPUsed = 10000 + 10000 + 1000 = 21000 ; 60 + 20 + 2 = 82Gi. podsHPRequest = 40000 + 10000 ; 120Gi.
        podsHPMaxUsedReq = 40000 + 10000 + 1000 = 51000 ; 100 + 20 + 2 = 122Gi (B's request counts here too).
zone 1: podsHPUsed = 10000 + 1000 = 11000 ; 22Gi. podsHPRequest = 10000 ; 20Gi. podsHPMaxUsedReq = 11000 ; 22Gi.
usage policy: cpu 49000 − 19600 − 1500 − 21000 = 6900 (zone 0), − 11000 = 16900 (zone 1).
"""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest

from schemas import kube, topology, vocab
from schemas.nodemetric_json import NodeUsageSnapshot, PodUsage
from services.noderesource import core, numa
from services.noderesource.strategy import ColocationStrategy

NOW = 1_767_268_800.0
GI = 1024**3
BATCH_CPU, BATCH_MEMORY = vocab.BATCH_CPU, vocab.BATCH_MEMORY
MARGIN_MEMORY = 73_658_689_126  # 196Gi × 0.35 = 73658689126.4, truncated
ALLOC_MEMORY = 196 * GI


def node(annotations: dict[str, str] | None = None) -> kube.Node:
    return msgspec.convert(
        {
            "metadata": {"name": "n", "annotations": annotations or {}},
            "status": {
                "capacity": {"cpu": "100", "memory": "400Gi"},
                "allocatable": {"cpu": "98", "memory": "392Gi"},
            },
        },
        kube.Node,
    )


def pod(
    name: str,
    cpu: str,
    memory: str,
    *,
    priority: str = "koord-prod",
    qos: str | None = None,
    phase: str = "Running",
    numa_nodes: list[int] | None = None,
    status_text: str | None = None,
) -> kube.Pod:
    labels = {vocab.PRIORITY_CLASS_LABEL: priority}
    if qos is not None:
        labels[vocab.QOS_CLASS_LABEL] = qos
    annotations = {}
    if numa_nodes is not None:
        status = {"numaNodeResources": [{"node": n, "resources": {"cpu": "1"}} for n in numa_nodes]}
        annotations[kube.ANNOTATION_RESOURCE_STATUS] = json.dumps(status)
    if status_text is not None:
        annotations[kube.ANNOTATION_RESOURCE_STATUS] = status_text
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "default", "labels": labels, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "resources": {"requests": {"cpu": cpu, "memory": memory}}}]},
            "status": {"phase": phase, "qosClass": "Burstable"},
        },
        kube.Pod,
    )


def usage(name: str, cpu_milli: int, memory: int, priority: str = "koord-prod") -> PodUsage:
    return PodUsage(namespace="default", name=name, usage={"cpu": cpu_milli, "memory": memory}, priority=priority)


def nrt(*zones: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": topology.API_VERSION, "kind": topology.KIND, "metadata": {"name": "n"}, "zones": list(zones)}


def zone(name: str, **allocatable: str) -> dict[str, Any]:
    return {
        "name": name,
        "type": topology.ZONE_TYPE_NODE,
        "resources": [{"name": k, "capacity": v, "allocatable": v, "available": v} for k, v in allocatable.items()],
    }


TWO_ZONES = topology.parse_numa_zones(
    nrt(zone("node-0", cpu="49", memory="196Gi"), zone("node-1", cpu="49", memory="196Gi"))
)
EXAMPLE_PODS = [pod("a", "40", "100Gi", numa_nodes=[0]), pod("b", "20", "40Gi")]
EXAMPLE_METRICS = (usage("a", 10_000, 60 * GI), usage("c", 2_000, 4 * GI))


def snapshot(**changes: Any) -> NodeUsageSnapshot:
    base = NodeUsageSnapshot(update_time=NOW - 60, system_usage={"cpu": 3000, "memory": 10 * GI}, pods=EXAMPLE_METRICS)
    return msgspec.structs.replace(base, **changes)


def run(
    *,
    pods: list[kube.Pod] | None = None,
    metrics: NodeUsageSnapshot | None = None,
    zones: tuple[topology.NumaZone, ...] = TWO_ZONES,
    the_node: kube.Node | None = None,
    **strategy_changes: Any,
) -> numa.ZoneBatchResult:
    result = numa.calculate(
        the_node or node(),
        [kube.summarize_pod(p) for p in (EXAMPLE_PODS if pods is None else pods)],
        metrics or snapshot(),
        ColocationStrategy(enable=True, **strategy_changes),
        zones,
    )
    assert result is not None
    return result


def values(result: numa.ZoneBatchResult, name: str) -> list[int | None]:
    return [z.resources[name].value for z in result.zones]


def term(result: numa.ZoneBatchResult, index: int, name: str, key: str) -> int:
    return result.zones[index].resources[name].terms[key]


# --- the worked example and the three policies


def test_worked_example_usage_policy() -> None:
    result = run()
    assert [z.zone for z in result.zones] == ["node-0", "node-1"]
    assert values(result, BATCH_CPU) == [6900, 16900]
    assert values(result, BATCH_MEMORY) == [
        ALLOC_MEMORY - MARGIN_MEMORY - 5 * GI - 82 * GI,
        ALLOC_MEMORY - MARGIN_MEMORY - 5 * GI - 22 * GI,
    ]
    cpu0 = result.zones[0].resources[BATCH_CPU]
    assert cpu0.policy == "usage"
    assert cpu0.formula == "zoneAllocatable − zoneSafetyMargin − zoneSystemUsedOrReserved − zonePodsHPUsed"
    assert cpu0.message == (
        f"{BATCH_CPU} node-0 6900 = zoneAllocatable 49000 − zoneSafetyMargin 19600"
        " − zoneSystemUsedOrReserved 1500 − zonePodsHPUsed 21000"
    )
    assert cpu0.terms == {
        "zoneAllocatable": 49000,
        "zoneSafetyMargin": 19600,
        "zoneSystemUsed": 1500,
        "zoneNodeReserved": 1000,
        "zoneSystemUsedOrReserved": 1500,
        "zonePodsHPUsed": 21000,
        "zonePodsHPRequest": 50000,
        "zonePodsHPMaxUsedReq": 51000,
        "zones": 2,
    }
    mem1 = result.zones[1].resources[BATCH_MEMORY]
    assert (mem1.terms["zonePodsHPUsed"], mem1.terms["zonePodsHPRequest"]) == (22 * GI, 20 * GI)
    assert mem1.terms["zoneSafetyMargin"] == MARGIN_MEMORY and mem1.note == ""
    assert result.zones[0].milli_values == {
        BATCH_CPU: 6900 * 1000,
        BATCH_MEMORY: (ALLOC_MEMORY - MARGIN_MEMORY - 87 * GI) * 1000,
    }
    assert result.pods == core.PodAccounting(
        high_priority=2, high_priority_without_metric=1, dangling_metrics_counted=1
    )
    assert result.values()["node-1"] == {BATCH_CPU: 16900, BATCH_MEMORY: ALLOC_MEMORY - MARGIN_MEMORY - 27 * GI}


def test_memory_request_policy_uses_reserved_and_requests() -> None:
    result = run(memory_calculate_policy="request")
    assert values(result, BATCH_MEMORY) == [
        ALLOC_MEMORY - MARGIN_MEMORY - 4 * GI - 120 * GI,
        ALLOC_MEMORY - MARGIN_MEMORY - 4 * GI - 20 * GI,
    ]
    assert result.zones[0].resources[BATCH_MEMORY].policy == "request"


def test_cpu_request_policy_falls_back_to_usage() -> None:
    result = run(cpu_calculate_policy="request")
    assert values(result, BATCH_CPU) == [6900, 16900]
    assert result.zones[0].resources[BATCH_CPU].policy == "usage"


def test_max_usage_request_policy_clamps_at_zero() -> None:
    result = run(cpu_calculate_policy="maxUsageRequest", memory_calculate_policy="maxUsageRequest")
    assert values(result, BATCH_CPU) == [0, 16900]  # zone 0: 49000 − 19600 − 1500 − 51000 = −23100
    assert values(result, BATCH_MEMORY) == [
        ALLOC_MEMORY - MARGIN_MEMORY - 5 * GI - 122 * GI,
        ALLOC_MEMORY - MARGIN_MEMORY - 5 * GI - 22 * GI,
    ]
    assert "max(zoneAllocatable 49000 − zoneSafetyMargin 19600 − zoneSystemUsedOrReserved 1500 − " in (
        result.zones[0].resources[BATCH_CPU].message
    )
    assert "= -23100, 0)" in result.zones[0].resources[BATCH_CPU].message


def test_threshold_caps_apply_to_zone_allocatable() -> None:
    result = run(batch_cpu_threshold_percent=20, batch_memory_threshold_percent=10)
    assert values(result, BATCH_CPU) == [6900, 9800]  # zone 1: min(16900, 49000 × 20% = 9800)
    assert values(result, BATCH_MEMORY) == [int(ALLOC_MEMORY * 0.1)] * 2
    cpu1 = result.zones[1].resources[BATCH_CPU]
    assert (cpu1.terms["uncapped"], cpu1.terms["cap"]) == (16900, 9800)
    assert cpu1.formula.startswith("min(") and "zoneAllocatable 49000 × 20% = 9800)" in cpu1.message


# --- splitting pods across zones


def test_pod_without_allocation_is_split_across_all_zones() -> None:
    result = run(pods=[pod("a", "40", "100Gi"), pod("b", "20", "40Gi")])
    # A now splits too: 5000 used per zone; B 10000 per zone; C 1000 per zone.
    assert [term(result, i, BATCH_CPU, "zonePodsHPUsed") for i in (0, 1)] == [16000, 16000]
    assert [term(result, i, BATCH_CPU, "zonePodsHPRequest") for i in (0, 1)] == [30000, 30000]
    assert values(result, BATCH_CPU) == [11900, 11900]


def test_allocation_to_the_other_zone() -> None:
    result = run(pods=[pod("a", "40", "100Gi", numa_nodes=[1]), pod("b", "20", "40Gi")])
    assert values(result, BATCH_CPU) == [16900, 6900]


def test_allocation_on_both_zones_divides_by_their_count() -> None:
    result = run(pods=[pod("a", "40", "100Gi", numa_nodes=[0, 1]), pod("b", "20", "40Gi")])
    assert [term(result, i, BATCH_MEMORY, "zonePodsHPRequest") for i in (0, 1)] == [70 * GI, 70 * GI]


def test_invalid_numa_ids_are_ignored_and_duplicates_counted() -> None:
    out_of_range = run(pods=[pod("a", "40", "100Gi", numa_nodes=[2, -1]), pod("b", "20", "40Gi")])
    assert values(out_of_range, BATCH_CPU) == [11900, 11900]  # no valid id: split across all
    mixed = run(pods=[pod("a", "40", "100Gi", numa_nodes=[1, 7]), pod("b", "20", "40Gi")])
    assert values(mixed, BATCH_CPU) == [16900, 6900]  # only the valid id counts
    duplicate = run(pods=[pod("a", "40", "100Gi", numa_nodes=[0, 0])], metrics=snapshot(pods=()))
    # Koordinator divides by the 2 entries and gives zone 0 one share: half of A's request vanishes.
    assert [term(duplicate, i, BATCH_CPU, "zonePodsHPRequest") for i in (0, 1)] == [20000, 0]


def test_bad_resource_status_annotation_means_no_allocation() -> None:
    for text in ("{not json", '{"numaNodeResources": [{"node": "0"}]}', '{"numaNodeResources": 3}', "[1]"):
        result = run(pods=[pod("a", "40", "100Gi", status_text=text), pod("b", "20", "40Gi")])
        assert values(result, BATCH_CPU) == [11900, 11900], text


def test_dangling_metric_is_split_evenly() -> None:
    result = run(pods=[], metrics=snapshot(pods=(usage("c", 2_001, 4 * GI + 1),)))
    for index in (0, 1):
        assert term(result, index, BATCH_CPU, "zonePodsHPUsed") == 1001  # 2001 / 2 = 1000.5, up
        assert term(result, index, BATCH_CPU, "zonePodsHPMaxUsedReq") == 1001
        assert term(result, index, BATCH_CPU, "zonePodsHPRequest") == 0
    assert result.zones[0].milli_values[BATCH_MEMORY] == (ALLOC_MEMORY - MARGIN_MEMORY - 5 * GI) * 1000 - (
        2 * GI * 1000 + 500
    )
    assert result.pods.dangling_metrics_counted == 1
    low = run(pods=[], metrics=snapshot(pods=(usage("c", 2_000, 4 * GI, priority="koord-batch"),)))
    assert low.pods.dangling_metrics_skipped == 1 and term(low, 0, BATCH_CPU, "zonePodsHPUsed") == 0


def test_pod_without_metric_counts_its_request_in_both_sums() -> None:
    result = run(pods=[pod("b", "20", "40Gi")], metrics=snapshot(pods=()))
    for index in (0, 1):
        assert term(result, index, BATCH_CPU, "zonePodsHPUsed") == 10000
        assert term(result, index, BATCH_CPU, "zonePodsHPMaxUsedReq") == 10000  # the node level leaves it out
        assert term(result, index, BATCH_MEMORY, "zonePodsHPMaxUsedReq") == 20 * GI
    assert result.pods.high_priority_without_metric == 1


def test_lse_pod_holds_its_cpu_request_and_uses_its_memory_usage() -> None:
    pods = [pod("a", "40", "100Gi", qos="LSE", numa_nodes=[0])]
    result = run(pods=pods, metrics=snapshot(pods=(usage("a", 10_000, 60 * GI),)))
    assert term(result, 0, BATCH_CPU, "zonePodsHPUsed") == 40000
    assert term(result, 0, BATCH_MEMORY, "zonePodsHPUsed") == 60 * GI
    assert term(result, 0, BATCH_MEMORY, "zonePodsHPMaxUsedReq") == 100 * GI
    assert term(result, 1, BATCH_CPU, "zonePodsHPUsed") == 0
    assert result.pods.high_priority_lse == 1


def test_low_priority_and_finished_pods_are_skipped() -> None:
    pods = [pod("a", "40", "100Gi", priority="koord-batch"), pod("b", "20", "40Gi", phase="Succeeded")]
    result = run(pods=pods, metrics=snapshot(pods=(usage("a", 10_000, 60 * GI),)))
    assert term(result, 0, BATCH_CPU, "zonePodsHPUsed") == 0 and term(result, 0, BATCH_CPU, "zonePodsHPRequest") == 0
    assert (result.pods.low_priority_skipped, result.pods.not_running_or_pending_skipped) == (1, 1)
    assert result.pods.dangling_metrics_counted == 0  # a's metric matched its (low-priority) pod


# --- system usage and reservation divided by N, rounded up in milli units


def test_system_used_and_reserved_divide_rounding_up() -> None:
    odd = snapshot(pods=(), system_usage={"cpu": 3001, "memory": 10 * GI + 1})
    result = run(pods=[], metrics=odd)
    assert term(result, 0, BATCH_CPU, "zoneSystemUsed") == 1501  # 1500.5 → 1501
    assert term(result, 0, BATCH_MEMORY, "zoneSystemUsed") == 5 * GI + 1  # 5Gi + 0.5 byte, rounded up in terms
    memory = result.zones[0].resources[BATCH_MEMORY]
    exact = (ALLOC_MEMORY - MARGIN_MEMORY) * 1000 - (5 * GI * 1000 + 500)
    assert result.zones[0].milli_values[BATCH_MEMORY] == exact
    assert memory.value == -(-exact // 1000)
    assert f"zoneSystemUsedOrReserved {5 * GI}.5 " in memory.message and "fractions of a byte" in memory.note
    reserved = node({"node.koordinator.sh/reservation": json.dumps({"resources": {"cpu": "5001m"}})})
    by_request = run(pods=[], metrics=snapshot(pods=()), the_node=reserved, memory_calculate_policy="request")
    assert term(by_request, 1, BATCH_CPU, "zoneNodeReserved") == 2501  # max(kubelet 2000, annotation 5001) / 2
    assert term(by_request, 1, BATCH_MEMORY, "zoneNodeReserved") == 4 * GI


def test_host_apps_above_batch_count_as_system_usage() -> None:
    from schemas.nodemetric_json import HostApplicationUsage

    apps = (HostApplicationUsage(name="h", usage={"cpu": 1000}, priority="koord-prod"),)
    result = run(pods=[], metrics=snapshot(pods=(), host_applications=apps))
    assert term(result, 0, BATCH_CPU, "zoneSystemUsed") == 2000


# --- zones


def test_zone_without_cpu_or_memory_counts_in_n_with_zero_allocatable() -> None:
    zones = topology.parse_numa_zones(
        nrt(
            zone("node-0", cpu="49", memory="196Gi"), zone("node-1", cpu="49"), zone("node-2", **{"hugepages-1Gi": "2"})
        )
    )
    assert [(z.name, z.cpu, z.memory) for z in zones] == [
        ("node-0", 49000, ALLOC_MEMORY),
        ("node-1", 49000, None),
        ("node-2", None, None),
    ]
    result = run(pods=[], metrics=snapshot(pods=()), zones=zones)
    assert term(result, 0, BATCH_CPU, "zoneSystemUsed") == 1000  # 3000 / 3 zones
    assert values(result, BATCH_CPU) == [49000 - 19600 - 1000, 49000 - 19600 - 1000, 0]
    assert values(result, BATCH_MEMORY)[1:] == [0, 0]


def test_topology_without_cpu_or_memory_is_skipped() -> None:
    assert topology.parse_numa_zones(nrt(zone("node-0", **{"hugepages-1Gi": "2"}))) == ()
    assert topology.parse_numa_zones(nrt()) == ()
    assert topology.parse_numa_zones({"metadata": {"name": "n"}}) == ()
    none = numa.calculate(
        node(), [kube.summarize_pod(p) for p in EXAMPLE_PODS], snapshot(), ColocationStrategy(enable=True), ()
    )
    assert none is None


def test_bad_topology_quantity_is_a_format_error() -> None:
    with pytest.raises(
        topology.TopologyFormatError, match=r"capacity of cpu: cannot parse quantity 'lots'.*zones\[0\]\.resources\[0\]"
    ):
        topology.parse_numa_zones(nrt(zone("node-0", cpu="lots")))
    with pytest.raises(topology.TopologyFormatError, match=r"zones"):
        topology.parse_numa_zones({"zones": "node-0"})
    assert issubclass(topology.TopologyFormatError, ValueError)


def test_resource_status_annotation_parser() -> None:
    key = kube.ANNOTATION_RESOURCE_STATUS
    assert kube.resource_status_numa_nodes({}) == ()
    good = {"cpuset": "0-3", "numaNodeResources": [{"node": 1, "resources": {"cpu": "4"}}, {"node": 0}]}
    assert kube.resource_status_numa_nodes({key: json.dumps(good)}) == (1, 0)
    assert kube.resource_status_numa_nodes({key: '{"numaNodeResources": [{}]}'}) == (0,)  # Go's zero value
    for bad in ("", "null", "{", '{"numaNodeResources": [{"node": 0, "resources": {"cpu": "x"}}]}'):
        assert kube.resource_status_numa_nodes({key: bad}) == (), bad
    assert kube.resource_status_numa_nodes({key: '{"numaNodeResources": [{"node": 4294967296}]}'}) == ()
    assert topology.zone_name(3) == "node-3"


# --- NRT entries


def nrt_zones(*zones: dict[str, Any]) -> list[topology.Zone]:
    decoded = topology.decode_topology(nrt(*zones)).zones
    assert decoded is not None
    return decoded


def entry(zone_: topology.Zone, name: str) -> tuple[Any, Any, Any]:
    info = topology.batch_entries(zone_, (name,))[name]
    return info.capacity, info.allocatable, info.available


def test_entries_added_sorted_and_scaled_by_cpu_normalization() -> None:
    current = nrt_zones(zone("node-0", cpu="49", memory="196Gi"), zone("node-1", cpu="49", memory="196Gi"))
    written = numa.zone_entries(current, run(), cpu_normalization_ratio="1.5", diff_threshold=0.1)
    assert [info.name for info in written[0].resources or ()] == ["cpu", BATCH_CPU, BATCH_MEMORY, "memory"]
    assert entry(written[0], BATCH_CPU) == ("10350",) * 3  # 6900 × 1.5
    assert entry(written[1], BATCH_CPU) == ("25350",) * 3
    assert entry(written[0], BATCH_MEMORY) == (str(ALLOC_MEMORY - MARGIN_MEMORY - 87 * GI),) * 3
    unscaled = numa.zone_entries(current, run(), cpu_normalization_ratio="0.8", diff_threshold=0.1)
    assert entry(unscaled[0], BATCH_CPU) == ("6900",) * 3  # a ratio not above 1 is ignored
    fractional = numa.zone_entries(current, run(), cpu_normalization_ratio="1.05", diff_threshold=0.1)
    assert entry(fractional[0], BATCH_CPU) == ("7245",) * 3
    odd = numa.zone_entries(current, run(), cpu_normalization_ratio="1.0001", diff_threshold=0.1)
    assert entry(odd[0], BATCH_CPU)[0] == "6900690m"  # 6900 × 1.0001 = 6900.69, not rounded on the NRT


def test_fractional_memory_entry_is_written_in_milli() -> None:
    current = nrt_zones(zone("node-0", cpu="49", memory="196Gi"), zone("node-1", cpu="49", memory="196Gi"))
    result = run(pods=[], metrics=snapshot(pods=(), system_usage={"cpu": 3000, "memory": 10 * GI + 1}))
    written = numa.zone_entries(current, result, cpu_normalization_ratio=None, diff_threshold=0.1)
    assert entry(written[0], BATCH_MEMORY)[0] == f"{(ALLOC_MEMORY - MARGIN_MEMORY - 5 * GI) * 1000 - 500}m"


def test_zone_without_result_is_reset_to_zero_and_threshold_keeps_small_moves() -> None:
    current = nrt_zones(
        zone("node-0", cpu="49", memory="196Gi", **{BATCH_CPU: "6800", BATCH_MEMORY: "1Gi"}),
        zone("node-1", cpu="49", memory="196Gi"),
        zone("node-9", cpu="1", **{BATCH_CPU: "500", BATCH_MEMORY: "0"}),
        zone("node-8", cpu="1"),
    )
    written = numa.zone_entries(current, run(), cpu_normalization_ratio=None, diff_threshold=0.1)
    assert entry(written[0], BATCH_CPU) == ("6800",) * 3  # 6800 → 6900 is within 10 %: kept
    assert entry(written[0], BATCH_MEMORY) == (str(ALLOC_MEMORY - MARGIN_MEMORY - 87 * GI),) * 3
    assert entry(written[2], BATCH_CPU) == ("0",) * 3 and entry(written[2], BATCH_MEMORY) == ("0",) * 3
    assert [info.name for info in written[3].resources or ()] == ["cpu"]  # nothing added to a zone without result
    decision = numa.needs_zone_update(current, written, 0.1, NOW - 10, NOW, 300)
    assert decision.needed and f"{BATCH_MEMORY} capacity of zone node-0 differs" in decision.reason


def test_needs_zone_update() -> None:
    result = run()
    current = nrt_zones(zone("node-0", cpu="49"), zone("node-1", cpu="49"))
    first = numa.zone_entries(current, result, cpu_normalization_ratio=None, diff_threshold=0.1)
    added = numa.needs_zone_update(current, first, 0.1, NOW - 10, NOW, 300)
    assert added.needed and added.reason == f"{BATCH_CPU} added to zone node-0"
    same = numa.zone_entries(first, result, cpu_normalization_ratio=None, diff_threshold=0.1)
    assert same == first
    quiet = numa.needs_zone_update(first, same, 0.1, NOW - 300, NOW, 300)
    assert (quiet.needed, quiet.reason) == (False, "up to date")
    assert numa.needs_zone_update(first, same, 0.1, None, NOW, 300).needed  # never written
    expired = numa.needs_zone_update(first, same, 0.1, NOW - 301, NOW, 300)
    assert expired.needed and "updateTimeThresholdSeconds 300" in expired.reason
    moved = run(pods=[pod("a", "40", "100Gi"), pod("b", "20", "40Gi")])  # zone 0: 6900 → 11900
    second = numa.zone_entries(first, moved, cpu_normalization_ratio=None, diff_threshold=0.1)
    decision = numa.needs_zone_update(first, second, 0.1, NOW - 10, NOW, 300)
    assert decision.needed and f"{BATCH_CPU} capacity of zone node-0" in decision.reason
    renamed = [msgspec.structs.replace(z, name=f"x-{z.name}") for z in first]  # no result for these zones
    reset = numa.zone_entries(renamed, result, cpu_normalization_ratio=None, diff_threshold=1.0)
    assert numa.needs_zone_update(renamed, reset, 1.0, NOW - 10, NOW, 300).needed  # reset counts at threshold 1


def test_zones_are_addressed_by_position_not_name() -> None:
    swapped = topology.parse_numa_zones(
        nrt(zone("node-1", cpu="49", memory="196Gi"), zone("node-0", cpu="49", memory="196Gi"))
    )
    result = run(zones=swapped)  # A is allocated on NUMA 0: the first zone, whatever its name
    assert [(z.zone, z.index, z.resources[BATCH_CPU].value) for z in result.zones] == [
        ("node-1", 0, 6900),
        ("node-0", 1, 16900),
    ]


@pytest.mark.parametrize("policy", ["usage", "request", "maxUsageRequest"])
def test_one_zone_holding_the_whole_node_matches_the_node_level(policy: str) -> None:
    whole = topology.parse_numa_zones(nrt(zone("node-0", cpu="100", memory="400Gi")))
    pods = [pod("a", "40", "100Gi"), pod("d", "1", "1Gi", priority="koord-batch")]  # every HP pod has a metric
    strategy = ColocationStrategy(enable=True, cpu_calculate_policy=policy, memory_calculate_policy=policy)
    zoned = numa.calculate(node(), [kube.summarize_pod(p) for p in pods], snapshot(), strategy, whole)
    flat = core.calculate(node(), [kube.summarize_pod(p) for p in pods], snapshot(), strategy, NOW)
    assert zoned is not None
    assert zoned.values()["node-0"] == {name: flat.resources[name].value for name in core.BATCH_RESOURCES}
    assert zoned.pods == flat.pods
