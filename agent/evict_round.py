"""One evaluation round of koordlet's memory and CPU eviction exactly as Koordinator computes it (spec §5.5.2,
§5.5.3). Pure. Its caller is `koordbus calc memory-evict` / `cpu-evict` (koordbus.calc_evict), whose contract
(../shared/design/CALC-CONTRACT.md) these functions follow rule by rule; agent.evict_strategy holds the NodeSLO
strategy, its checks and the node-level formulas.

The agent's own loops evict by agent.evict, which departs from Koordinator on purpose in places (an unreadable
eviction-policy annotation lets a pod be picked there, and BEMemoryEvict only looks at active pods); this module
follows Koordinator. What the two share (feature and label names) is taken from agent.evict.

A round builds one task per enabled feature — what to release (per resource), on which ledger ("used" for the
usage-driven features, "requested" for the request-driven ones), and the candidates in eviction order — and then
walks the tasks (`pick_victims`): each takes candidates until its ledger covers its release, and every pick credits
each ledger with the largest amount any task assigns that pod.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final

from agent import evict, evict_strategy
from schemas import kube, resources, vocab

CPU_EVICT: Final = evict.CPU
"""Koordinator's usage-driven CPU eviction of any pod."""
LEDGER_USED: Final = "used"
LEDGER_REQUESTED: Final = "requested"
_GO_INT: Final = re.compile(r"[+-]?[0-9]+")


def go_int(text: str | None, *, bits: int) -> int | None:
    """strconv.ParseInt(text, 10, bits): an optional sign and ASCII digits, in range; else None."""
    if text is None or not _GO_INT.fullmatch(text):
        return None
    value = int(text)
    return value if -(2 ** (bits - 1)) <= value < 2 ** (bits - 1) else None


# --- pods


@dataclass(frozen=True, kw_only=True)
class EvictPod:
    """An input pod with what the strategies read of it, derived once (`evict_pod`)."""

    pod: kube.Pod
    usage: float | None
    """Its last usage sample: bytes (memory) or millicores (CPU); None when it has none."""
    key: str
    """`namespace/name`: a pod is picked once per round by it."""
    priority_value: int
    priority_class: str
    """Both "with default" (spec §0)."""

    @property
    def used(self) -> int:
        """The sample truncated to an integer; 0 without one."""
        return int(self.usage) if self.usage is not None else 0

    @property
    def labels(self) -> Mapping[str, str]:
        return self.pod.metadata.labels


def evict_pod(pod: kube.Pod, usage: float | None) -> EvictPod:
    return EvictPod(
        pod=pod,
        usage=usage,
        key=kube.pod_key(pod),
        priority_value=kube.pod_priority_value(pod),
        priority_class=kube.pod_priority_class(pod),
    )


def eviction_allowed(pod: kube.Pod, feature: str) -> bool:
    """The annotation koordinator.sh/eviction-policy: absent → allowed; else a JSON list of strings naming `feature`
    (unparsable, or not a list of strings → not allowed; JSON null, as Go reads it, is an empty list)."""
    text = pod.metadata.annotations.get(evict.EVICTION_POLICY)
    if text is None:
        return True
    try:
        policy = json.loads(text)
    except ValueError:
        return False
    # Go decodes into []string: a null element is left "", anything else not a string fails the whole list.
    if not isinstance(policy, list) or not all(p is None or isinstance(p, str) for p in policy):
        return False
    return feature in policy


def is_be(pod: kube.Pod) -> bool:
    """The raw QoS label is exactly BE (no fallback to the Kubernetes QoS)."""
    return pod.metadata.labels.get(vocab.QOS_CLASS_LABEL) == vocab.QOS_BE


def _extended_request(pod: kube.Pod, name: str) -> int:
    """Σ of `name` requests over containers and sidecar init containers, a missing or negative one as 0."""
    sidecars = [c for c in pod.spec.init_containers or () if c.restart_policy == kube.RESTART_ALWAYS]
    total = 0
    for container in [*(pod.spec.containers or ()), *sidecars]:
        total += max(kube.resource_amounts(container.resources.requests).get(name, 0), 0)
    return total


def batch_cpu_request(pod: kube.Pod) -> int:
    """Σ positive batch-cpu requests (millicores): what BECPUEvict counts a BE pod to release."""
    return _extended_request(pod, vocab.BATCH_CPU)


_EXTENDED: Final[Mapping[str, Mapping[str, str]]] = {
    vocab.PRIORITY_BATCH: {resources.CPU: vocab.BATCH_CPU, resources.MEMORY: vocab.BATCH_MEMORY},
    vocab.PRIORITY_MID: {resources.CPU: vocab.MID_CPU, resources.MEMORY: vocab.MID_MEMORY},
}


def pod_request(pod: EvictPod, resource: str) -> tuple[str, int]:
    """(resource name, amount) of the pod's request of `resource` ("cpu" or "memory") by its class: batch-* or mid-*
    summed over containers and sidecars for koord-batch / koord-mid, else the Kubernetes pod request."""
    extended = _EXTENDED.get(pod.priority_class)
    if extended is not None:
        name = extended[resource]
        return name, _extended_request(pod.pod, name)
    return resource, kube.pod_request(pod.pod).get(resource, 0)


# --- the allocatable formula


@dataclass(frozen=True, kw_only=True)
class AllocatableRelease:
    release: dict[str, int]
    pod_release: list[dict[str, int] | None]
    """Per input pod (same order): what its eviction releases, for koord-batch / koord-mid pods while a resource of
    theirs is to be released; None for the others."""
    steps: dict[str, str] = field(default_factory=dict)
    """Per requested resource, how its release came out."""


def allocatable_release(
    pods: Sequence[EvictPod],
    allocatable: Mapping[str, int],
    *,
    resource: str,
    threshold: int,
    lower: int,
    priority_threshold: int,
) -> AllocatableRelease:
    """MemoryAllocatableEvict / CPUAllocatableEvict: the requests of pods at or under the priority threshold against
    the node's allocatable (memory: (q/a − lower%) × a; cpu: q − lower% × a, both in float64)."""
    if threshold < 0:
        return AllocatableRelease(release={}, pod_release=[None] * len(pods))
    requested: dict[str, int] = {}
    for pod in pods:
        if pod.priority_value <= priority_threshold:
            name, amount = pod_request(pod, resource)
            requested[name] = requested.get(name, 0) + amount
    release: dict[str, int] = {}
    steps: dict[str, str] = {}
    for name, q in requested.items():
        a = allocatable.get(name, 0)
        if a == 0:
            release[name] = q
            steps[name] = f"no allocatable {name}: all of the {q} requested"
            continue
        ratio = float(q) / float(a)
        if ratio <= float(threshold) / 100:
            steps[name] = f"requested {q} / allocatable {a} ≤ {threshold}%: nothing"
        elif resource == resources.MEMORY:
            release[name] = int((ratio - float(lower) / 100) * float(a))
            steps[name] = f"({q} / {a} − {lower}%) × {a} = {release[name]}"
        else:
            release[name] = int(float(q) - float(lower) / 100 * float(a))
            steps[name] = f"{q} − {lower}% × {a} = {release[name]}"
    classes = {klass for klass, names in _EXTENDED.items() if names[resource] in release}
    pod_release: list[dict[str, int] | None] = []
    for pod in pods:
        if pod.priority_class in classes:
            name, amount = pod_request(pod, resource)
            pod_release.append({name: amount})
        else:
            pod_release.append(None)
    return AllocatableRelease(release=release, pod_release=pod_release, steps=steps)


# --- orders


def _stable_sort(indices: list[int], less: Callable[[int, int], bool]) -> list[int]:
    """Sorted by a Go `less` comparator; ties keep input order."""

    def compare(i: int, j: int) -> int:
        return -1 if less(i, j) else (1 if less(j, i) else 0)

    return sorted(indices, key=functools.cmp_to_key(compare))


def priority_order(
    pods: Sequence[EvictPod], feature: str, *, priority_threshold: int, last_key: Callable[[EvictPod], int]
) -> list[int]:
    """Candidates of MemoryEvict, MemoryAllocatableEvict, CPUEvict, CPUAllocatableEvict (indices into `pods`): active,
    allowed, priority value ≤ the threshold, eviction-enabled, with a usage sample; by eviction-priority annotation,
    priority value, koordinator.sh/priority label (all ascending), then `last_key` descending."""
    chosen = [
        i
        for i, p in enumerate(pods)
        if kube.is_running_or_pending(p.pod)
        and eviction_allowed(p.pod, feature)
        and p.priority_value <= priority_threshold
        and p.labels.get(evict.EVICTION_ENABLED) == "true"
        and p.usage is not None
    ]

    def key(i: int) -> tuple[int, int, int, int]:
        p = pods[i]
        eviction_priority = go_int(p.pod.metadata.annotations.get(evict.EVICTION_PRIORITY), bits=32) or 0
        label_priority = go_int(p.labels.get(evict.PRIORITY_LABEL), bits=64)
        label = label_priority if label_priority is not None else p.priority_value
        return eviction_priority, p.priority_value, label, -last_key(p)

    return sorted(chosen, key=key)


def be_memory_order(pods: Sequence[EvictPod]) -> list[int]:
    """BEMemoryEvict's candidates: BE pods (any phase) allowed by the policy; spec.priority ascending when both are set
    and differ, else larger use first when both non-zero, names descending when both zero, else the non-zero first."""
    chosen = [i for i, p in enumerate(pods) if is_be(p.pod) and eviction_allowed(p.pod, evict.BE_MEMORY)]

    def less(i: int, j: int) -> bool:
        a, b = pods[i], pods[j]
        pa, pb = a.pod.spec.priority, b.pod.spec.priority
        if pa is not None and pb is not None and pa != pb:
            return pa < pb
        if a.used != 0 and b.used != 0:
            return a.used > b.used
        if a.used == 0 and b.used == 0:
            return a.pod.metadata.name > b.pod.metadata.name
        return b.used == 0

    return _stable_sort(chosen, less)


def be_cpu_usage(pod: EvictPod) -> float:
    """cpuUsed / cpuRequest (batch-cpu); 0 without a request."""
    request = batch_cpu_request(pod.pod)
    return pod.used / request if request > 0 else 0.0


def be_cpu_order(pods: Sequence[EvictPod]) -> list[int]:
    """BECPUEvict's candidates: BE pods (any phase) allowed by the policy; when either spec.priority is absent or
    both are equal, cpuUsed/request descending, else spec.priority ascending."""
    chosen = [i for i, p in enumerate(pods) if is_be(p.pod) and eviction_allowed(p.pod, evict.BE_CPU)]
    usage = {i: be_cpu_usage(pods[i]) for i in chosen}

    def less(i: int, j: int) -> bool:
        pa, pb = pods[i].pod.spec.priority, pods[j].pod.spec.priority
        if pa is None or pb is None or pa == pb:
            return usage[i] > usage[j]
        return pa < pb

    return _stable_sort(chosen, less)


# --- tasks and victims


@dataclass(frozen=True, kw_only=True)
class Task:
    ledger: str
    release: dict[str, int]
    candidates: list[int]
    """Indices into the round's pods, in eviction order."""
    amounts: Callable[[int], Mapping[str, int] | None]
    """What evicting pod i credits this task's ledger."""


def _covered(release: Mapping[str, int], ledger: Mapping[str, int]) -> bool:
    return all(amount <= ledger.get(name, 0) for name, amount in release.items())


def _credit(tasks: Sequence[Task], i: int) -> dict[str, dict[str, int]]:
    """Per ledger, the largest amount any task assigns pod i, per resource (Koordinator merges by max from zero, so a
    negative amount credits nothing)."""
    credit: dict[str, dict[str, int]] = {}
    for task in tasks:
        ledger = credit.setdefault(task.ledger, {})
        for name, amount in (task.amounts(i) or {}).items():
            if amount > ledger.get(name, 0):
                ledger[name] = amount
    return credit


def pick_victims(tasks: Sequence[Task], keys: Sequence[str]) -> list[int]:
    """Koordinator's KillAndEvictPods for one round: indices of the victims in eviction order."""
    active = [t for t in tasks if any(amount > 0 for amount in t.release.values())]
    ledgers: dict[str, dict[str, int]] = {}
    picked: list[int] = []
    taken: set[str] = set()
    for task in active:
        if _covered(task.release, ledgers.get(task.ledger, {})):
            continue
        for i in task.candidates:
            if keys[i] in taken:
                continue
            taken.add(keys[i])
            picked.append(i)
            for name, amounts in _credit(active, i).items():
                ledgers[name] = resources.add(ledgers.get(name, {}), amounts)
            if _covered(task.release, ledgers.get(task.ledger, {})):
                break
    return picked


@dataclass(frozen=True, kw_only=True)
class Feature:
    """One eviction feature of a kind, in the kind's order: its config check and how it builds its task."""

    name: str
    check: Callable[[evict_strategy.ThresholdStrategy], str | None]
    build: Callable[[evict_strategy.ThresholdStrategy], Task]


@dataclass(frozen=True, kw_only=True)
class Round:
    tasks: dict[str, Task | str]
    """Per feature whose gate is on: its task, or why it was refused; absent when the strategy's enable is false."""
    victims: list[int]


def evaluate(
    features: Sequence[Feature],
    *,
    gates: Mapping[str, bool],
    slo: evict_strategy.NodeSLO | None,
    evaluable: bool,
    keys: Sequence[str],
) -> Round:
    """koordlet's round: nothing without a node or capacity (`evaluable`), else each gated feature in order — refused
    when the NodeSLO cannot say whether it is on or its config check fails, skipped when enable is false — and then
    the victims of the tasks built."""
    tasks: dict[str, Task | str] = {}
    if not evaluable:
        return Round(tasks=tasks, victims=[])
    strategy = slo.resource_used_threshold_with_be if slo is not None else None
    for feature in features:
        if not gates.get(feature.name, False):
            continue
        problem = evict_strategy.feature_error(slo)
        if problem is not None or strategy is None:
            tasks[feature.name] = problem or "no strategy"
            continue
        if strategy.enable is False:
            continue
        problem = feature.check(strategy)
        if problem is not None:
            tasks[feature.name] = f"skip {feature.name}, invalid config: {problem}"
            continue
        tasks[feature.name] = feature.build(strategy)
    built = [task for task in tasks.values() if isinstance(task, Task)]
    return Round(tasks=tasks, victims=pick_victims(built, keys))
