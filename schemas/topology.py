"""NodeResourceTopology zones and the pod NUMA allocation annotation, as the NUMA-level batch calculation reads them.

A NodeResourceTopology (`topology.node.k8s.io/v1alpha1`, cluster-scoped, named after its node; koordlet writes one
zone per NUMA node, `node-0`, `node-1`…, sorted by name) lists per zone `resources: [{name, capacity, allocatable,
available}]`. `decode_topology` reads the object's JSON (unknown fields ignored, every quantity checked, a bad one
raising `TopologyFormatError` with its JSON path); `numa_zones` gives the zones in the object's order with their
cpu (millicores) and memory (bytes) allocatable; services.noderesource.numa computes per-zone batch resources from
them (spec §2.7) and writes back `ResourceInfo` entries. Which NUMA nodes a pod is allocated on is
kube.PodSummary.numa_nodes (from its `scheduling.koordinator.sh/resource-status` annotation).

Koordinator's calculation addresses zones by position, not by name: NUMA id N is the N-th zone of the list (which
is `node-N` as koordlet writes and sorts them, up to ten NUMA nodes), and every zone counts in the zone count, even
one that lists neither cpu nor memory (its allocatable is then 0). Only an object in which no zone lists cpu or
memory is skipped: `numa_zones` returns no zones for it. Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import msgspec

from schemas import kube, quantity, resources

API_VERSION: Final = "topology.node.k8s.io/v1alpha1"
KIND: Final = "NodeResourceTopology"
ZONE_TYPE_NODE: Final = "Node"

_CPU, _MEMORY = resources.CPU, resources.MEMORY


class TopologyFormatError(ValueError):
    """A NodeResourceTopology object that does not decode: a bad quantity or a wrong shape, with its JSON path."""


def zone_name(numa_id: int) -> str:
    """The zone koordlet writes for NUMA node `numa_id` (`node-0`)."""
    return f"node-{numa_id}"


# --- NodeResourceTopology


class ResourceInfo(msgspec.Struct, frozen=True, kw_only=True):
    """One `zones[].resources[]` entry; quantities kept as written (absent is zero, as Go reads it)."""

    name: str
    capacity: quantity.RawQuantity = "0"
    allocatable: quantity.RawQuantity = "0"
    available: quantity.RawQuantity = "0"

    def __post_init__(self) -> None:
        for field in ("capacity", "allocatable", "available"):
            try:
                quantity.parse_quantity(getattr(self, field))
            except quantity.QuantityError as err:
                raise ValueError(f"{field} of {self.name}: {err}") from None


class Zone(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    type: str = ""
    parent: str = ""
    resources: list[ResourceInfo] | None = None


class NodeResourceTopology(msgspec.Struct, frozen=True, kw_only=True):
    metadata: kube.ObjectMeta = kube.ObjectMeta()
    zones: list[Zone] | None = None


class NumaZone(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A zone as the calculation reads it: its name and its cpu/memory allocatable (None when not listed)."""

    name: str
    cpu: int | None = None
    """Allocatable cpu in millicores."""
    memory: int | None = None
    """Allocatable memory in bytes."""


def decode_topology(obj: Mapping[str, Any]) -> NodeResourceTopology:
    """The NodeResourceTopology in `obj` (its JSON as a dict); `TopologyFormatError` when it does not decode."""
    try:
        return msgspec.convert(obj, NodeResourceTopology)
    except msgspec.ValidationError as err:
        raise TopologyFormatError(f"NodeResourceTopology: {err}") from None


def numa_zones(nrt: NodeResourceTopology) -> tuple[NumaZone, ...]:
    """The zones in the object's order with their cpu/memory allocatable; none when no zone lists cpu or memory
    (Koordinator then skips the NUMA-level calculation). A zone listing a resource twice: the last entry counts."""
    zones = nrt.zones or []
    out: list[NumaZone] = []
    for zone in zones:
        amounts: dict[str, int] = {}
        for info in zone.resources or ():
            if info.name in (_CPU, _MEMORY):
                amounts[info.name] = quantity.amount(info.name, info.allocatable)
        out.append(NumaZone(name=zone.name, cpu=amounts.get(_CPU), memory=amounts.get(_MEMORY)))
    if all(zone.cpu is None and zone.memory is None for zone in out):
        return ()
    return tuple(out)


def parse_numa_zones(obj: Mapping[str, Any]) -> tuple[NumaZone, ...]:
    """`numa_zones(decode_topology(obj))`."""
    return numa_zones(decode_topology(obj))


def batch_entries(zone: Zone, names: Sequence[str]) -> dict[str, ResourceInfo]:
    """The zone's entries of the resources `names`, by name (the last one when listed twice)."""
    return {info.name: info for info in zone.resources or () if info.name in names}
