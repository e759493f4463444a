"""services.k8s.topology_writes and the topology mirror's pure parts: the NodeResourceTopology koordlet would write for
an agent's report (zones, quantities, annotations byte for byte as Go marshals them), the update that keeps the
noderesource service's batch entries and others' labels and annotations, and both against the v1alpha1 CRD schema
(read from ../shared)."""

from __future__ import annotations

import copy
import json
from typing import Any

import msgspec
import pytest

from bus import subjects
from bus.api import Delivery
from bus.errors import PermanentError
from schemas import topology, vocab
from schemas.node_topology import (
    CpuBasicInfo,
    CpuReport,
    KubeletCpuManager,
    NodeTopologyReported,
    NumaZoneReport,
    PodCpuAlloc,
    encode_topology,
)
from services.k8s import topology_mirror, writes
from services.k8s.topology_writes import (
    MANAGED_ANNOTATIONS,
    ReportError,
    desired_topology,
    format_cpu_list,
    go_json,
    parse_cpu_list,
    topology_update,
)
from tests.support.crd import assert_valid_topology

GiB = 1024**3
BASIC = "node.koordinator.sh/cpu-basic-info"
CPU_TOPOLOGY = "node.koordinator.sh/cpu-topology"
POLICY = "kubelet.koordinator.sh/cpu-manager-policy"
ALLOCS = "node.koordinator.sh/pod-cpu-allocs"
POOLS = "node.koordinator.sh/cpu-shared-pools"
BE_POOLS = "node.koordinator.sh/be-cpu-shared-pools"


def report(numa_nodes: int, *, cpus_per_node: int = 4, **fields: Any) -> NodeTopologyReported:
    """A node of `numa_nodes` NUMA nodes with `cpus_per_node` CPUs each (two hyper-threads per core), two sockets
    when there are at least two NUMA nodes, 64 GiB per NUMA node of which 2 GiB are 1Gi huge pages."""
    sockets = 2 if numa_nodes >= 2 else 1
    cpus = [
        CpuReport(id=n * cpus_per_node + i, core=(n * cpus_per_node + i) // 2, socket=n * sockets // numa_nodes, numa=n)
        for n in range(numa_nodes)
        for i in range(cpus_per_node)
    ]
    zones = [
        NumaZoneReport(
            numa=n,
            cpus=f"{n * cpus_per_node}-{(n + 1) * cpus_per_node - 1}",
            cpu_count=cpus_per_node,
            memory=62 * GiB,
            hugepages_1gi=2 * GiB,
        )
        for n in range(numa_nodes)
    ]
    return NodeTopologyReported(node="node-a", at=1.0, zones=zones, cpus=cpus, **fields)


def resource(name: str, text: str) -> dict[str, str]:
    return {"name": name, "capacity": text, "allocatable": text, "available": text}


# --- the desired object


@pytest.mark.parametrize("numa_nodes", [1, 2, 4])
def test_one_zone_per_numa_node_in_numa_order_with_koordlets_resources(numa_nodes: int) -> None:
    obj = desired_topology(report(numa_nodes))
    assert obj["apiVersion"] == "topology.node.k8s.io/v1alpha1" and obj["kind"] == "NodeResourceTopology"
    assert obj["metadata"]["name"] == "node-a"
    assert obj["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "koordbus"}
    assert obj["topologyPolicies"] == ["None"]
    assert [zone["name"] for zone in obj["zones"]] == [f"node-{n}" for n in range(numa_nodes)]
    for zone in obj["zones"]:
        assert zone["type"] == "Node"
        assert zone["resources"] == [  # sorted by name; capacity = allocatable = available
            resource("cpu", "4"),
            resource("hugepages-1Gi", "2Gi"),
            resource("hugepages-2Mi", "0"),
            resource("memory", "62Gi"),
        ]
    assert_valid_topology(obj)


def test_the_noderesource_numa_path_reads_zone_n_as_numa_node_n() -> None:
    zones = topology.parse_numa_zones(desired_topology(report(4, cpus_per_node=8)))
    assert zones == tuple(topology.NumaZone(name=f"node-{n}", cpu=8_000, memory=62 * GiB) for n in range(4))


def test_zones_follow_numa_ids_not_the_report_order_and_a_repeated_id_counts_once() -> None:
    zones = [
        NumaZoneReport(numa=1, cpu_count=2, memory=GiB),
        NumaZoneReport(numa=0, cpu_count=2, memory=GiB),
        NumaZoneReport(numa=1, cpu_count=3, memory=GiB),
    ]
    obj = desired_topology(NodeTopologyReported(node="node-a", at=1.0, zones=zones))
    assert [zone["name"] for zone in obj["zones"]] == ["node-0", "node-1"]
    assert obj["zones"][1]["resources"][0] == resource("cpu", "3")


def test_quantities_are_gos_string_of_koordlets_quantities() -> None:
    zone = NumaZoneReport(numa=0, cpu_count=1000, memory=25_000, hugepages_2mi=512 * 2 * 1024**2)
    (written,) = desired_topology(NodeTopologyReported(node="node-a", at=1.0, zones=[zone]))["zones"]
    by_name = {entry["name"]: entry["capacity"] for entry in written["resources"]}
    # cpu: NewQuantity(n, DecimalSI); bytes: NewQuantity(n, BinarySI), plain digits when not a whole KiB multiple
    assert by_name == {"cpu": "1k", "memory": "25000", "hugepages-2Mi": "1Gi", "hugepages-1Gi": "0"}


def test_a_report_without_zones_is_a_valid_object_without_zones() -> None:
    obj = desired_topology(NodeTopologyReported(node="node-a", at=1.0))
    assert obj["zones"] == []
    assert_valid_topology(obj)


# --- annotations, as Go's json.Marshal writes koordlet's structs


def test_annotations_are_koordlets_json_byte_for_byte() -> None:
    kubelet = KubeletCpuManager(
        policy="static",
        default_cpus="0,3-15",
        reserved_cpus="0,1",
        pod_allocs=[PodCpuAlloc(uid="uid-b", cpus="9,8"), PodCpuAlloc(uid="uid-a", cpus="2")],
    )
    basic = CpuBasicInfo(
        cpu_model="Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz",
        vendor_id="GenuineIntel",
        hyper_thread_enabled=True,
    )
    annotations = desired_topology(report(2, cpus_per_node=8, basic=basic, kubelet=kubelet))["metadata"]["annotations"]
    assert set(annotations) == set(MANAGED_ANNOTATIONS)
    assert annotations[BASIC] == (
        '{"cpuModel":"Intel(R) Xeon(R) Platinum 8269CY CPU @ 2.50GHz",'
        '"hyperThreadEnabled":true,"vendorID":"GenuineIntel"}'
    )
    detail = ",".join(f'{{"id":{i},"core":{i // 2},"socket":{i // 8},"node":{i // 8}}}' for i in range(16))
    assert annotations[CPU_TOPOLOGY] == f'{{"detail":[{detail}]}}'
    assert annotations[POLICY] == '{"policy":"static","reservedCPUs":"0-1"}'
    assert annotations[ALLOCS] == (
        '[{"uid":"uid-a","cpuset":"2","managedByKubelet":true},{"uid":"uid-b","cpuset":"8-9","managedByKubelet":true}]'
    )
    pools = '[{"socket":0,"node":0,"cpuset":"0-1,3-7"},{"socket":1,"node":1,"cpuset":"10-15"}]'
    assert annotations[POOLS] == pools
    assert annotations[BE_POOLS] == pools  # no LSE pods known: the same pools


def test_empty_values_marshal_as_go_marshals_them() -> None:
    annotations = desired_topology(NodeTopologyReported(node="node-a", at=1.0))["metadata"]["annotations"]
    assert annotations == {
        BASIC: "{}",  # every field omitempty
        CPU_TOPOLOGY: "{}",  # detail omitempty
        POLICY: '{"policy":"none"}',
        ALLOCS: "null",  # a nil slice
        POOLS: "null",
        BE_POOLS: "null",
    }


def test_only_the_static_cpu_manager_reports_reserved_and_exclusive_cpus() -> None:
    kubelet = KubeletCpuManager(policy="none", reserved_cpus="0", pod_allocs=[PodCpuAlloc(uid="u", cpus="1")])
    annotations = desired_topology(report(1, kubelet=kubelet))["metadata"]["annotations"]
    assert annotations[POLICY] == '{"policy":"none"}'
    assert annotations[ALLOCS] == "null"
    assert annotations[POOLS] == '[{"socket":0,"node":0,"cpuset":"0-3"}]'


def test_a_pod_listed_twice_has_the_union_and_an_empty_one_is_left_out() -> None:
    allocs = [PodCpuAlloc(uid="u", cpus="1"), PodCpuAlloc(uid="u", cpus="2-3"), PodCpuAlloc(uid="empty", cpus="")]
    annotations = desired_topology(report(1, kubelet=KubeletCpuManager(policy="static", pod_allocs=allocs)))
    assert annotations["metadata"]["annotations"][ALLOCS] == '[{"uid":"u","cpuset":"1-3","managedByKubelet":true}]'
    assert annotations["metadata"]["annotations"][POOLS] == '[{"socket":0,"node":0,"cpuset":"0"}]'


def test_go_json_escapes_what_gos_html_safe_encoder_escapes() -> None:
    assert go_json({"cpuModel": "a<b>&c\u2028é"}) == '{"cpuModel":"a\\u003cb\\u003e\\u0026c\\u2028é"}'
    assert go_json(None) == "null"


@pytest.mark.parametrize(
    ("text", "canonical"),
    [("", ""), ("0", "0"), ("3,0-1,2", "0-3"), ("8-9,1,4-5,5-6", "1,4-6,8-9"), ("0-999999", "0-999999")],
)
def test_cpu_lists_are_merged_into_koordinators_canonical_form(text: str, canonical: str) -> None:
    assert format_cpu_list(parse_cpu_list(text)) == canonical


@pytest.mark.parametrize("text", [",", "1,", "-", "1-", "3-1", "1--2", "12345678", "0-1000001"])
def test_a_malformed_cpu_list_is_a_report_error(text: str) -> None:
    with pytest.raises(ReportError):
        parse_cpu_list(text)
    kubelet = KubeletCpuManager(policy="static", pod_allocs=[PodCpuAlloc(uid="u", cpus=text)])
    with pytest.raises(ReportError, match="cpus of pod u"):
        desired_topology(report(1, kubelet=kubelet))


# --- the update over what the server holds


def stored(obj: dict[str, Any]) -> dict[str, Any]:
    """`obj` as the API server returns it."""
    held = copy.deepcopy(obj)
    held["metadata"] |= {"resourceVersion": "41", "uid": "u-1", "creationTimestamp": "2026-01-01T00:00:00Z"}
    return held


def with_batch(obj: dict[str, Any], cpu: int = 6_900) -> dict[str, Any]:
    """`obj` after the noderesource service's write of its zones' batch entries (the writer's own function)."""
    zones = {zone["name"]: {vocab.BATCH_CPU: cpu, vocab.BATCH_MEMORY: 3 * GiB} for zone in obj["zones"]}
    updated = writes.topology_with_batch_zones(obj, zones)
    assert updated is not None
    return updated


def test_nothing_is_written_when_the_server_holds_ours() -> None:
    desired = desired_topology(report(2))
    assert topology_update(stored(desired), desired) is None


def test_equal_amounts_and_json_written_differently_are_not_rewritten() -> None:
    desired = desired_topology(report(1))
    held = stored(desired)
    held["zones"][0]["resources"][3] = resource("memory", str(62 * GiB))
    held["metadata"]["annotations"][POLICY] = '{ "policy": "none" }'
    assert topology_update(held, desired) is None


def test_batch_entries_and_others_labels_and_annotations_survive_our_update() -> None:
    held = with_batch(stored(desired_topology(report(2))))
    held["metadata"]["labels"]["team"] = "infra"
    held["metadata"]["annotations"]["node.koordinator.sh/reservation"] = '{"reservedCPUs":"0"}'
    held["zones"][0]["attributes"] = [{"name": "cache", "value": "L3"}]
    changed = report(2, cpus_per_node=6)
    update = topology_update(held, desired_topology(changed))
    assert update is not None
    assert update["metadata"]["resourceVersion"] == "41"  # the replace is guarded by it
    assert update["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "koordbus", "team": "infra"}
    assert update["metadata"]["annotations"]["node.koordinator.sh/reservation"] == '{"reservedCPUs":"0"}'
    assert update["metadata"]["annotations"][POOLS] == desired_topology(changed)["metadata"]["annotations"][POOLS]
    assert update["zones"][0]["attributes"] == [{"name": "cache", "value": "L3"}]
    for zone in update["zones"]:
        assert [entry["name"] for entry in zone["resources"]] == [
            "cpu",
            "hugepages-1Gi",
            "hugepages-2Mi",
            vocab.BATCH_CPU,
            vocab.BATCH_MEMORY,
            "memory",
        ]
        assert zone["resources"][0] == resource("cpu", "6")
        assert zone["resources"][3] == resource(vocab.BATCH_CPU, "6900")
    assert_valid_topology(update)
    # and the noderesource writer, writing the same values again over ours, finds nothing to do (no ping-pong)
    zones = {zone["name"]: {vocab.BATCH_CPU: 6_900, vocab.BATCH_MEMORY: 3 * GiB} for zone in update["zones"]}
    assert writes.topology_with_batch_zones(update, zones) is None
    assert topology_update(update, desired_topology(changed)) is None


def test_zones_no_longer_reported_are_removed_and_new_ones_appended() -> None:
    held = with_batch(stored(desired_topology(report(4))))
    held["zones"].append({"name": "socket-0", "type": "Socket"})
    shrunk = topology_update(held, desired_topology(report(2)))
    assert shrunk is not None and [zone["name"] for zone in shrunk["zones"]] == ["node-0", "node-1"]
    assert all(vocab.BATCH_CPU in [e["name"] for e in zone["resources"]] for zone in shrunk["zones"])
    grown = topology_update(shrunk, desired_topology(report(4)))
    assert grown is not None and [zone["name"] for zone in grown["zones"]] == [f"node-{n}" for n in range(4)]
    assert [e["name"] for e in grown["zones"][3]["resources"]] == ["cpu", "hugepages-1Gi", "hugepages-2Mi", "memory"]
    assert_valid_topology(shrunk)
    assert_valid_topology(grown)


def test_an_object_another_writer_created_gets_our_policies_label_and_annotations() -> None:
    held = {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": "node-a", "resourceVersion": "3", "labels": {"app.kubernetes.io/managed-by": "other"}},
        "topologyPolicies": ["SingleNUMANodePodLevel"],
        "zones": [{"name": "node-0", "type": "Node", "resources": [resource("cpu", "bad")]}],
    }
    desired = desired_topology(report(1))
    update = topology_update(held, desired)
    assert update is not None
    assert update["topologyPolicies"] == ["None"]
    assert update["metadata"]["labels"] == {"app.kubernetes.io/managed-by": "koordbus"}
    assert update["metadata"]["annotations"] == desired["metadata"]["annotations"]
    assert update["zones"] == desired["zones"]
    assert topology_update(update, desired) is None


# --- the mirror's handler and record-only sink


class _Offers:
    def __init__(self) -> None:
        self.offered: dict[str, dict[str, Any]] = {}

    def offer(self, node: str, desired: dict[str, Any]) -> None:
        self.offered[node] = desired


def delivery(node: str, data: bytes) -> Delivery:
    subject = f"{subjects.node_topology(node)}.{subjects.node_partition(node)}"
    return Delivery(subject=subject, data=data, headers={}, stream_seq=1, num_delivered=1, published_at=1.0)


async def test_the_handler_offers_the_nodes_object() -> None:
    offers = _Offers()
    handler = topology_mirror._Handler(offers)  # type: ignore[arg-type]
    await handler.handle(delivery("node-a", encode_topology(report(2))))
    assert offers.offered == {"node-a": desired_topology(report(2))}


async def test_the_handler_refuses_what_cannot_be_written() -> None:
    handler = topology_mirror._Handler(_Offers())  # type: ignore[arg-type]
    with pytest.raises(PermanentError, match="names node 'node-a', its subject 'node-b'"):
        await handler.handle(delivery("node-b", encode_topology(report(1))))
    bad = report(1, kubelet=KubeletCpuManager(policy="static", reserved_cpus="3-1"))
    with pytest.raises(PermanentError, match="kubelet reserved cpus"):
        await handler.handle(delivery("node-a", encode_topology(bad)))
    with pytest.raises(msgspec.ValidationError):  # the bus dead-letters these too
        await handler.handle(delivery("node-a", msgspec.msgpack.encode({"type": "node.topology_reported.v1"})))


async def test_record_only_keeps_the_objects_and_logs_only_changes() -> None:
    sink = topology_mirror.RecordingTopologySink(keep=10, clock=lambda: 5.0)
    assert await sink.write(desired_topology(report(1))) == "created"
    assert await sink.write(desired_topology(report(1))) == "unchanged"
    assert await sink.write(desired_topology(report(2))) == "updated"
    exported = sink.export()
    assert [zone["name"] for zone in exported["objects"]["node-a"]["zones"]] == ["node-0", "node-1"]
    assert exported["writes"] == [
        {"at": 5.0, "node": "node-a", "action": "created"},
        {"at": 5.0, "node": "node-a", "action": "updated"},
    ]
    json.dumps(exported)  # JSON-ready for the recorded-writes route
