"""What the topology mirror writes for one agent's report: the node's NodeResourceTopology as koordlet writes it, and
the update that keeps what other writers put there. Pure.

`desired_topology(report)` renders a NodeTopologyReported as the `topology.node.k8s.io/v1alpha1` object koordlet's
nodeTopoInformer would write: named after the node, labelled managed-by koordbus, `topologyPolicies: ["None"]`, one
zone `node-N` of type Node per reported NUMA node in NUMA order (koordlet sorts by name, the same order up to ten
NUMA nodes; the NUMA-level batch calculation reads zone N as NUMA node N), each with `cpu` (the zone's CPU count),
`memory` (MemTotal less huge pages, bytes), `hugepages-2Mi` and `hugepages-1Gi` (bytes, zero when none), entries
sorted by name with capacity = allocatable = available (koordlet's allocatable is a copy of capacity and its
ZoneResourcesToZoneList sets available to allocatable; the CRD requires all three). Quantities are Go's String() of
koordlet's (DecimalSI for cpu, BinarySI for bytes). Its annotations are koordlet's JSON, byte for byte as Go's
json.Marshal writes them (`go_json`): cpu-basic-info, cpu-topology, cpu-manager-policy, pod-cpu-allocs,
cpu-shared-pools and be-cpu-shared-pools.

Where koordbus knows less than koordlet, said once here: the topology policy is always None (the bridge does not
read the kubelet's topology manager configuration); the CPUs koord-scheduler gave LSE/LSR pods (their
`resource-status` cpuset) are not taken out of the shared pools, and the BE pools equal the LS pools (koordlet takes
LSE pods' CPUs out of the BE pools only): the mirror reads no pods; the node's `reservation` and
`system-qos-resource` annotations are not written, nor their CPUs taken out of the pools; pod-cpu-allocs entries
carry no namespace or name (the kubelet's state file has only uids).

`topology_update(current, desired)` is the object to PUT over what the server holds, or None when it already holds
ours: zones the report no longer has are removed (as koordlet's TrimDifferentZone does), the others keep their
other resources entries (the noderesource service's `kubernetes.io/batch-cpu` / `batch-memory`, services.k8s.writes.
topology_with_batch_zones) and fields, our four resources are replaced, our annotations replaced and every other
annotation and label kept. Quantities are compared by amount and annotations by their JSON value, so a writer that
respells them causes no write. Called by services.k8s.topology_mirror.
"""

from __future__ import annotations

import bisect
import copy
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

from schemas import quantity, resources, topology
from schemas.node_topology import CpuReport, NodeTopologyReported, NumaZoneReport

Json = dict[str, Any]

GROUP, VERSION = topology.API_VERSION.split("/")
PLURAL: Final = "noderesourcetopologies"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "koordbus"}
TOPOLOGY_POLICY_NONE: Final = "None"

HUGEPAGES_2MI: Final = "hugepages-2Mi"
HUGEPAGES_1GI: Final = "hugepages-1Gi"
MANAGED_RESOURCES: Final = (resources.CPU, resources.MEMORY, HUGEPAGES_2MI, HUGEPAGES_1GI)
"""The zone resources koordbus writes; every other entry of a zone belongs to someone else and is kept."""
_QUANTITY_FIELDS: Final = ("capacity", "allocatable", "available")

ANNOTATION_CPU_BASIC_INFO: Final = "node.koordinator.sh/cpu-basic-info"
ANNOTATION_CPU_TOPOLOGY: Final = "node.koordinator.sh/cpu-topology"
ANNOTATION_CPU_MANAGER_POLICY: Final = "kubelet.koordinator.sh/cpu-manager-policy"
ANNOTATION_POD_CPU_ALLOCS: Final = "node.koordinator.sh/pod-cpu-allocs"
ANNOTATION_CPU_SHARED_POOLS: Final = "node.koordinator.sh/cpu-shared-pools"
ANNOTATION_BE_CPU_SHARED_POOLS: Final = "node.koordinator.sh/be-cpu-shared-pools"
MANAGED_ANNOTATIONS: Final = (
    ANNOTATION_CPU_BASIC_INFO,
    ANNOTATION_CPU_TOPOLOGY,
    ANNOTATION_CPU_MANAGER_POLICY,
    ANNOTATION_POD_CPU_ALLOCS,
    ANNOTATION_CPU_SHARED_POOLS,
    ANNOTATION_BE_CPU_SHARED_POOLS,
)
KUBELET_POLICY_STATIC: Final = "static"
"""Only under the static CPU manager does koordlet report reserved CPUs and the pods' exclusive CPUs."""
MAX_CPU_ID: Final = 1_000_000
"""The largest CPU id a cpu list may name (schemas.node_topology.CpuId's bound)."""

_CPU_SPAN: Final = re.compile(r"([0-9]{1,7})(?:-([0-9]{1,7}))?")
_GO_ESCAPES: Final = {
    ord("<"): "\\u003c",
    ord(">"): "\\u003e",
    ord("&"): "\\u0026",
    0x2028: "\\u2028",
    0x2029: "\\u2029",
}


class ReportError(ValueError):
    """A report that passed its schema but cannot be rendered (a malformed cpu list), with where."""


# --- Go's json.Marshal and the kernel's cpu lists


def go_json(value: Any) -> str:
    """json.Marshal's text of a value built of dicts (fields in Go's order), lists, strings, ints and bools: compact,
    UTF-8 as is, and `<`, `>`, `&`, U+2028, U+2029 escaped as Go's HTML-safe encoder does (they only occur inside
    strings, so the whole text can be translated)."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).translate(_GO_ESCAPES)


Intervals = list[tuple[int, int]]


def parse_cpu_list(text: str) -> Intervals:
    """The kernel's cpu list ("0-3,8") as sorted, merged, inclusive intervals; ReportError when malformed. Works on
    intervals, never on each id, so a hostile "0-999999" costs no more than "0-1"."""
    spans: Intervals = []
    for part in text.split(",") if text else ():
        if (match := _CPU_SPAN.fullmatch(part)) is None:
            raise ReportError(f"bad cpu list {text[:64]!r}: {part[:32]!r}")
        first = int(match[1])
        last = int(match[2]) if match[2] is not None else first
        if last < first or last > MAX_CPU_ID:
            raise ReportError(f"bad cpu range {part[:32]!r} in cpu list {text[:64]!r}")
        spans.append((first, last))
    return _merged(spans)


def _merged(spans: Iterable[tuple[int, int]]) -> Intervals:
    """Inclusive intervals sorted, overlapping and adjacent ones joined ("0-1,2-3" is "0-3", as a set of ids)."""
    merged: Intervals = []
    for first, last in sorted(spans):
        if merged and first <= merged[-1][1] + 1:
            merged[-1] = (merged[-1][0], max(merged[-1][1], last))
        else:
            merged.append((first, last))
    return merged


def format_cpu_list(spans: Iterable[tuple[int, int]]) -> str:
    """Koordinator's cpuset String() of merged intervals: "0-3,8"."""
    return ",".join(f"{first}" if first == last else f"{first}-{last}" for first, last in spans)


def _parse(text: str, where: str) -> Intervals:
    try:
        return parse_cpu_list(text)
    except ReportError as err:
        raise ReportError(f"{where}: {err}") from None


def _contains(spans: Intervals, cpu: int) -> bool:
    at = bisect.bisect_right(spans, (cpu, MAX_CPU_ID + 1)) - 1
    return at >= 0 and spans[at][0] <= cpu <= spans[at][1]


# --- the object koordbus wants


def desired_topology(report: NodeTopologyReported) -> Json:
    """The node's NodeResourceTopology as koordlet would write it from this report; ReportError for a malformed cpu
    list. A NUMA node reported twice counts once (its last entry)."""
    zones = sorted({zone.numa: zone for zone in report.zones}.values(), key=lambda zone: zone.numa)
    return {
        "apiVersion": topology.API_VERSION,
        "kind": topology.KIND,
        "metadata": {"name": report.node, "labels": dict(MANAGED_BY), "annotations": topology_annotations(report)},
        "topologyPolicies": [TOPOLOGY_POLICY_NONE],
        "zones": [_zone(zone) for zone in zones],
    }


def _zone(zone: NumaZoneReport) -> Json:
    amounts = {
        resources.CPU: quantity.format_integer(zone.cpu_count),
        resources.MEMORY: quantity.format_integer(zone.memory, binary=True),
        HUGEPAGES_2MI: quantity.format_integer(zone.hugepages_2mi, binary=True),
        HUGEPAGES_1GI: quantity.format_integer(zone.hugepages_1gi, binary=True),
    }
    return {
        "name": topology.zone_name(zone.numa),
        "type": topology.ZONE_TYPE_NODE,
        "resources": [_entry(name, amounts[name]) for name in sorted(amounts)],
    }


def _entry(name: str, text: str) -> Json:
    return {"name": name, "capacity": text, "allocatable": text, "available": text}


def topology_annotations(report: NodeTopologyReported) -> dict[str, str]:
    """koordlet's six annotations for this report, each the JSON text Go's json.Marshal gives for its struct."""
    kubelet = report.kubelet
    static = kubelet.policy == KUBELET_POLICY_STATIC
    allocs = _pod_allocs(report) if static else []
    pools = go_json(_shared_pools(report.cpus, _merged(span for _, spans in allocs for span in spans)) or None)
    policy: Json = {"policy": kubelet.policy} if kubelet.policy else {}
    if static and (reserved := format_cpu_list(_parse(kubelet.reserved_cpus, "kubelet reserved cpus"))):
        policy["reservedCPUs"] = reserved
    return {
        ANNOTATION_CPU_BASIC_INFO: go_json(_basic_info(report)),
        ANNOTATION_CPU_TOPOLOGY: go_json(_cpu_topology(report.cpus)),
        ANNOTATION_CPU_MANAGER_POLICY: go_json(policy),
        ANNOTATION_POD_CPU_ALLOCS: go_json(
            [{"uid": uid, "cpuset": format_cpu_list(spans), "managedByKubelet": True} for uid, spans in allocs] or None
        ),
        ANNOTATION_CPU_SHARED_POOLS: pools,
        ANNOTATION_BE_CPU_SHARED_POOLS: pools,
    }


def _basic_info(report: NodeTopologyReported) -> Json:
    """CPUBasicInfo's fields in Go's order, each `omitempty` (catL3CbmMask is not reported)."""
    basic = report.basic
    fields: list[tuple[str, object]] = [
        ("cpuModel", basic.cpu_model),
        ("hyperThreadEnabled", basic.hyper_thread_enabled),
        ("turboEnabled", basic.turbo_enabled),
        ("vendorID", basic.vendor_id),
    ]
    return {name: value for name, value in fields if value}


def _cpu_topology(cpus: Sequence[CpuReport]) -> Json:
    detail = [
        {"id": cpu.id, "core": cpu.core, "socket": cpu.socket, "node": cpu.numa}
        for cpu in sorted(cpus, key=lambda cpu: cpu.id)
    ]
    return {"detail": detail} if detail else {}  # `omitempty`


def _pod_allocs(report: NodeTopologyReported) -> list[tuple[str, Intervals]]:
    """(uid, its CPUs) of the pods the kubelet gave CPUs, by uid; a pod with an empty set is left out, a uid listed
    twice has the union of its sets (koordlet unions a pod's containers)."""
    by_uid: dict[str, Intervals] = {}
    for alloc in report.kubelet.pod_allocs:
        spans = _parse(alloc.cpus, f"cpus of pod {alloc.uid}")
        by_uid[alloc.uid] = _merged([*by_uid.get(alloc.uid, []), *spans])
    return [(uid, spans) for uid, spans in sorted(by_uid.items()) if spans]


def _shared_pools(cpus: Sequence[CpuReport], taken: Intervals) -> list[Json]:
    """The CPUs not in `taken`, one pool per NUMA node (its socket: its lowest CPU's), sorted by (socket, node)."""
    by_node: dict[int, list[CpuReport]] = {}
    for cpu in cpus:
        if not _contains(taken, cpu.id):
            by_node.setdefault(cpu.numa, []).append(cpu)
    pools = []
    for node, members in by_node.items():
        first = min(members, key=lambda cpu: cpu.id)
        pools.append(
            {"socket": first.socket, "node": node, "cpuset": format_cpu_list(_merged((c.id, c.id) for c in members))}
        )
    return sorted(pools, key=lambda pool: (pool["socket"], pool["node"]))


# --- the update over what the server holds


def topology_update(current: Json, desired: Json) -> Json | None:
    """`current` with desired's zones, topologyPolicies, labels and managed annotations, keeping what others own
    (see the module docstring); None when nothing differs."""
    update = copy.deepcopy(current)
    meta = update.setdefault("metadata", {})
    want_meta = desired["metadata"]
    meta["labels"] = {**(meta.get("labels") or {}), **want_meta.get("labels", {})}
    annotations = dict(meta.get("annotations") or {})
    for key, text in want_meta.get("annotations", {}).items():
        if not _same_json(annotations.get(key), text):
            annotations[key] = text
    meta["annotations"] = annotations
    update["topologyPolicies"] = list(desired["topologyPolicies"])
    held = {zone.get("name"): zone for zone in current.get("zones") or [] if isinstance(zone, dict)}
    update["zones"] = [_merged_zone(held.get(zone["name"]), zone) for zone in desired["zones"]]
    return None if update == current else update


def _merged_zone(held: Json | None, want: Json) -> Json:
    zone = copy.deepcopy(held) if held is not None else {}
    zone["name"], zone["type"] = want["name"], want["type"]
    entries = [entry for entry in zone.get("resources") or [] if isinstance(entry, dict)]
    by_name = {entry.get("name"): entry for entry in entries}
    ours = [
        by_name[entry["name"]] if _same_amounts(by_name.get(entry["name"]), entry) else entry
        for entry in want["resources"]
    ]
    foreign = [entry for entry in entries if entry.get("name") not in MANAGED_RESOURCES]
    zone["resources"] = sorted(ours + foreign, key=lambda entry: str(entry.get("name")))
    return zone


def _same_amounts(held: Mapping[str, Any] | None, want: Mapping[str, Any]) -> bool:
    if held is None:
        return False
    try:
        return all(
            quantity.parse_quantity(held.get(field, "0")).value == quantity.parse_quantity(want[field]).value
            for field in _QUANTITY_FIELDS
        )
    except (quantity.QuantityError, TypeError, ValueError):  # not a quantity: ours replaces it
        return False


def _same_json(held: str | None, want: str) -> bool:
    if held is None:
        return False
    if held == want:
        return True
    try:
        return bool(json.loads(held) == json.loads(want))
    except ValueError:
        return False
