"""Where the simulated cluster's scheduler may put a pod: pure.

The load-aware extender filters and scores nodes by their real load; what it leaves to kube-scheduler is whether the
pod's requests fit (NodeResourcesFit). koordbus.simcluster.loop asks the extender and this module: `free` is what
each node's allocatable leaves after the requests of the pods bound to it (each pod's `request` computed once),
`candidates` keeps the nodes where a pod's request fits in that room, and `best` picks the highest score the
extender's prioritize gave among them (ties by name, so a run is repeatable).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from schemas import kube, resources

FIT: tuple[str, ...] = (resources.CPU, resources.MEMORY)
"""The resources whose requests must fit (NodeResourcesFit over what the simulated nodes have)."""


def request(pod: kube.Pod) -> resources.ResourceList:
    """The pod's cpu and memory request (Kubernetes' effective request of the pod)."""
    return resources.mask(kube.pod_request(pod), FIT)


def free(
    allocatable: Mapping[str, Mapping[str, int]], bound: Iterable[tuple[str, Mapping[str, int]]]
) -> dict[str, resources.ResourceList]:
    """Each node's allocatable less the requests bound to it (`bound`: (node, request) per pod)."""
    room = {node: dict(amounts) for node, amounts in allocatable.items()}
    for node, amounts in bound:
        if node in room:
            room[node] = resources.sub(room[node], amounts)
    return room


def candidates(wanted: Mapping[str, int], *, room: Mapping[str, Mapping[str, int]]) -> list[str]:
    """The nodes (in name order) with room for `wanted`."""
    return [node for node in sorted(room) if all(amount <= room[node].get(name, 0) for name, amount in wanted.items())]


def best(scores: Mapping[str, int], *, among: Iterable[str]) -> str | None:
    """The node with the highest score among `among` (the first by name on a tie); None when none is scored."""
    scored = [(-scores[node], node) for node in among if node in scores]
    return min(scored)[1] if scored else None
