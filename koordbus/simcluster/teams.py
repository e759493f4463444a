"""The teams of a simulated cluster, their quota tree and the pods they run over time: pure.

`koordbus up --simulate-nodes N` (koordbus.simcluster.loop) imports `quotas(n)` through the quota API and asks
`wanted(n, now=)` every tick which team pods exist: each team runs a steady stream of pods, one starting every
`lifetime / replicas` seconds and running about `lifetime` seconds, so pods are created, scheduled and finish
all the time and about `replicas` of them want to run at once. Sizes grow with the node count so the tree looks the
same at 20 or 500 nodes: one parent, `engineering`, under the default tree's root, and four teams in namespaces of
their own names (the same-name-namespace rule), whose demand is set against their min so that some borrow:

  team-search   demand > min: borrows from the others (the larger shared weight)
  team-ml       demand > min: borrows too, with half the weight
  team-web      allow-lent-resource=false: its min is never lent, however little it uses (the lending limit)
  team-billing  its pods carry preemptible=false: non-preemptible request and used, within its min

Every number of a pod (name, uid, request, lifetime, usage) comes from a hash of the team and the pod's index, so a
restart wants the same pods at the same instants.
"""

from __future__ import annotations

import hashlib
import math
import uuid
from dataclasses import dataclass
from typing import Any, Final

from agent.simulate_pods import DAY, UsageProfile
from schemas import quota, vocab

GIB: Final = 1024**3
PARENT: Final = "engineering"


@dataclass(frozen=True)
class Team:
    name: str
    min_per_node: float
    """The quota's min, in cores per simulated node (memory: MEMORY_PER_CORE GiB a core)."""
    max_per_node: float
    shared_weight_per_node: float
    pod_cpu: float
    """Each pod's CPU request in cores (memory: MEMORY_PER_CORE GiB a core)."""
    replicas_per_node: float
    """About how many of its pods want to run at once, per simulated node."""
    lifetime: float = 300.0
    """How long a pod runs, on average (seconds)."""
    lends: bool = True
    preemptible: bool = True


MEMORY_PER_CORE: Final = 4
TEAMS: Final = (
    Team("team-search", 0.4, 1.0, 1.0, pod_cpu=2, replicas_per_node=0.35),
    Team("team-ml", 0.3, 0.8, 0.5, pod_cpu=4, replicas_per_node=0.12),
    Team("team-web", 0.3, 0.5, 0.5, pod_cpu=1, replicas_per_node=0.15, lends=False),
    Team("team-billing", 0.2, 0.3, 0.25, pod_cpu=1, replicas_per_node=0.15, preemptible=False),
)
USAGE_OF_REQUEST: Final = (0.45, 0.75)
"""A team pod uses this share of its CPU request on average (drawn per pod); memory 0.6 of its request."""


def _cores(per_node: float, nodes: int) -> int:
    """A team's share of `nodes` nodes in whole cores: at least one."""
    return max(round(per_node * nodes), 1)


def _resources(cores: int) -> dict[str, str]:
    return {"cpu": str(cores), "memory": f"{cores * MEMORY_PER_CORE}Gi"}


def _weight(cores: int) -> str:
    return f'{{"cpu":"{cores}","memory":"{cores * MEMORY_PER_CORE}Gi"}}'


def quotas(nodes: int) -> list[dict[str, Any]]:
    """The ElasticQuotas of the teams' tree for a cluster of `nodes` simulated nodes (parent first), as `kubectl get
    elasticquota -o yaml` would list them. The parent's min and max are the sums of its teams' rounded ones, so the
    quota service's rules hold at any node count (the children's min within the parent's, min ≤ max): rounded from
    the unrounded sums, the parent's min fell below its teams' at 1, 2, 5, 9 … nodes."""
    mins = [_cores(team.min_per_node, nodes) for team in TEAMS]
    maxes = [_cores(team.max_per_node, nodes) for team in TEAMS]
    items: list[dict[str, Any]] = [
        {
            "apiVersion": quota.API_VERSION,
            "kind": quota.KIND,
            "metadata": {
                "name": PARENT,
                "namespace": quota.QUOTA_NAMESPACE,
                "labels": {quota.LABEL_IS_PARENT: "true"},
                "annotations": {quota.ANNOTATION_SHARED_WEIGHT: _weight(sum(maxes))},
            },
            "spec": {"min": _resources(sum(mins)), "max": _resources(sum(maxes))},
        }
    ]
    for team, least, most in zip(TEAMS, mins, maxes, strict=True):
        labels = {quota.LABEL_PARENT: PARENT, quota.LABEL_IS_PARENT: "false"}
        if not team.lends:
            labels[quota.LABEL_ALLOW_LENT_RESOURCE] = "false"
        weight = _cores(team.shared_weight_per_node, nodes)
        items.append(
            {
                "apiVersion": quota.API_VERSION,
                "kind": quota.KIND,
                "metadata": {
                    "name": team.name,
                    "namespace": team.name,
                    "labels": labels,
                    "annotations": {quota.ANNOTATION_SHARED_WEIGHT: _weight(weight)},
                },
                "spec": {"min": _resources(least), "max": _resources(most)},
            }
        )
    return items


@dataclass(frozen=True)
class TeamPod:
    """One pod a team wants: its object (unscheduled) and how it will use a node."""

    team: str
    index: int
    start: float
    end: float
    pod: dict[str, Any]
    usage: UsageProfile

    @property
    def key(self) -> str:
        return f"{self.team}/{self.pod['metadata']['name']}"

    @property
    def uid(self) -> str:
        return str(self.pod["metadata"]["uid"])


def _fraction(*parts: object) -> float:
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


def _uid(*parts: object) -> str:
    return str(uuid.UUID(bytes=hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=16).digest(), version=4))


def spacing(team: Team, nodes: int) -> float:
    """Seconds between two of the team's pods starting."""
    return team.lifetime / max(team.replicas_per_node * nodes, 1.0)


def team_pod(team: Team, index: int, nodes: int) -> TeamPod:
    """The team's pod number `index` (pods start in index order, one every `spacing` seconds from the epoch)."""
    start = index * spacing(team, nodes)
    end = start + team.lifetime * (0.75 + 0.5 * _fraction(team.name, index, "lifetime"))
    cpu = team.pod_cpu
    memory = cpu * MEMORY_PER_CORE * GIB
    labels = {
        "app": f"{team.name}-worker",
        vocab.PRIORITY_CLASS_LABEL: vocab.PRIORITY_PROD,
        vocab.QOS_CLASS_LABEL: vocab.QOS_LS,
    }
    if not team.preemptible:
        labels[quota.LABEL_PREEMPTIBLE] = "false"
    requests = {"cpu": f"{cpu:g}", "memory": str(memory)}
    pod = {
        "metadata": {
            "name": f"{team.name}-worker-{index % 1_000_000:06d}",
            "namespace": team.name,
            "uid": _uid("simcluster", team.name, index),
            "labels": labels,
        },
        "spec": {
            "schedulerName": "koord-scheduler",
            "priority": vocab.PRIORITY_RANGES[vocab.PRIORITY_PROD][2],
            "priorityClassName": vocab.PRIORITY_PROD,
            "containers": [{"name": "worker", "resources": {"requests": requests}}],
        },
        "status": {"phase": "Pending", "qosClass": vocab.KUBE_QOS_BURSTABLE},
    }
    low, high = USAGE_OF_REQUEST
    share = low + (high - low) * _fraction(team.name, index, "usage")
    usage = UsageProfile(
        cpu=cpu * share,
        memory=0.6 * memory,
        amplitude=0.2,
        peak=DAY * _fraction(team.name, index, "peak"),
    )
    return TeamPod(team=team.name, index=index, start=start, end=end, pod=pod, usage=usage)


def wanted(nodes: int, *, now: float) -> list[TeamPod]:
    """Every team's pods that want to run at `now` (started, not yet finished), in start order per team."""
    pods: list[TeamPod] = []
    for team in TEAMS:
        step = spacing(team, nodes)
        first = math.floor((now - 1.25 * team.lifetime) / step)
        last = math.floor(now / step)
        for index in range(max(first, 0), last + 1):
            pod = team_pod(team, index, nodes)
            if pod.start <= now < pod.end:
                pods.append(pod)
    return pods
