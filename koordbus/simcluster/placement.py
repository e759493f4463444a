"""Where the simulated cluster's scheduler may put a pod: pure.

The load-aware extender filters and scores nodes by their real load; what it leaves to kube-scheduler is whether the
pod's requests fit (NodeResourcesFit). koordbus.simcluster.loop asks the extender and this module: `candidates`
keeps the nodes whose allocatable less the requests of the pods bound to them holds the pod's requests, and `best`
picks the highest score the extender's prioritize gave among them (ties by name, so a run is repeatable).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from schemas import kube, resources


def requested(pods: Iterable[kube.Pod]) -> resources.ResourceList:
    """What the pods request together (Kubernetes' effective request of each)."""
    return resources.total(kube.pod_request(pod) for pod in pods)


def fits(pod: kube.Pod, *, allocatable: Mapping[str, int], bound: Iterable[kube.Pod]) -> bool:
    """Whether the pod's cpu and memory requests fit in what the node's bound pods leave of its allocatable."""
    wanted = resources.mask(kube.pod_request(pod), (resources.CPU, resources.MEMORY))
    left = resources.sub(allocatable, requested(bound))
    return all(amount <= left.get(name, 0) for name, amount in wanted.items())


def candidates(
    pod: kube.Pod, *, allocatable: Mapping[str, Mapping[str, int]], bound: Mapping[str, Iterable[kube.Pod]]
) -> list[str]:
    """The nodes (in name order) the pod's requests fit on."""
    return [node for node in sorted(allocatable) if fits(pod, allocatable=allocatable[node], bound=bound.get(node, ()))]


def best(scores: Mapping[str, int], *, among: Iterable[str]) -> str | None:
    """The node with the highest score among `among` (the first by name on a tie); None when none is scored."""
    scored = [(-scores[node], node) for node in among if node in scores]
    return min(scored)[1] if scored else None
