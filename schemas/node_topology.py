"""What a node's agent reports of its hardware topology, for the NodeResourceTopology the bridge writes (issue 23.4).

`NodeTopologyReported` (koord.v1.node.<node>.topology, stream KOORD_NODE) is sent at start, whenever it changes and
every `refresh` interval; the bridge (services.k8s.topology_mirror) turns the newest one per node into the node's
NodeResourceTopology (`topology.node.k8s.io/v1alpha1`, named after the node): one zone `node-N` of type Node per NUMA
node with its cpu (the count of its CPUs) and memory (MemTotal less huge pages) as capacity and allocatable, and
koordlet's annotations — `node.koordinator.sh/cpu-basic-info`, `node.koordinator.sh/cpu-topology`,
`kubelet.koordinator.sh/cpu-manager-policy`, `node.koordinator.sh/pod-cpu-allocs`. The agent never talks to the API
server. Every field is bounded: the report comes from a node, and a node is outside the control plane's trust.
"""

from __future__ import annotations

from typing import Annotated, Final

import msgspec

from schemas.node import Bytes, NodeName, NumaId, UnixSeconds

MAX_CPUS: Final = 8192
MAX_NUMA_NODES: Final = 1024
MAX_POD_ALLOCS: Final = 4096
MAX_PROBLEMS: Final = 64

CpuId = Annotated[int, msgspec.Meta(ge=0, le=1_000_000)]
CpuList = Annotated[str, msgspec.Meta(max_length=16_384, pattern=r"^[0-9,\-]*$", description="kernel list format")]
ShortText = Annotated[str, msgspec.Meta(max_length=256)]
Problem = Annotated[str, msgspec.Meta(max_length=1024)]
PodUid = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[0-9A-Za-z_\-]+$")]


class CpuReport(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One logical CPU: its core, socket and NUMA node (koordlet's `cpu-topology` detail entry)."""

    id: CpuId
    core: CpuId
    socket: CpuId
    numa: NumaId


class NumaZoneReport(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One NUMA node: its CPUs and memory. `memory` is MemTotal less the huge pages (which are their own resources)."""

    numa: NumaId
    cpus: CpuList = ""
    cpu_count: Annotated[int, msgspec.Meta(ge=0, le=MAX_CPUS)] = 0
    memory: Bytes = 0
    hugepages_2mi: Bytes = 0
    hugepages_1gi: Bytes = 0


class CpuBasicInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """koordlet's CPUBasicInfo: what CPU normalization keys its ratios on (model, hyper-threading, turbo)."""

    cpu_model: ShortText = ""
    vendor_id: ShortText = ""
    hyper_thread_enabled: bool = False
    turbo_enabled: bool = False


class PodCpuAlloc(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """CPUs the kubelet's static CPU manager gave a pod exclusively (its `cpu_manager_state` entries)."""

    uid: PodUid
    cpus: CpuList


class KubeletCpuManager(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The kubelet's CPU manager as its state file says: policy (`none` when the file is absent), the default
    (shared) CPU set, the CPUs the kubelet reserves, and the pods with exclusive CPUs."""

    policy: ShortText = "none"
    default_cpus: CpuList = ""
    reserved_cpus: CpuList = ""
    pod_allocs: Annotated[list[PodCpuAlloc], msgspec.Meta(max_length=MAX_POD_ALLOCS)] = []


class NodeTopologyReported(
    msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, tag="node.topology_reported.v1"
):
    """A node's hardware topology as its agent read it; `problems` names what could not be read (never silent)."""

    node: NodeName
    at: UnixSeconds
    zones: Annotated[list[NumaZoneReport], msgspec.Meta(max_length=MAX_NUMA_NODES)] = []
    cpus: Annotated[list[CpuReport], msgspec.Meta(max_length=MAX_CPUS)] = []
    basic: CpuBasicInfo = CpuBasicInfo()
    kubelet: KubeletCpuManager = KubeletCpuManager()
    problems: Annotated[list[Problem], msgspec.Meta(max_length=MAX_PROBLEMS)] = []


TOPOLOGY_DECODER: Final = msgspec.msgpack.Decoder(NodeTopologyReported)
"""Decodes (and validates) a report; msgspec.DecodeError / ValidationError otherwise."""
_ENCODER: Final = msgspec.msgpack.Encoder()


def encode_topology(report: NodeTopologyReported) -> bytes:
    """The wire form (msgpack, as the node's other reports)."""
    return _ENCODER.encode(report)
