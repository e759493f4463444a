"""`koordbus calc memory-evict` and `koordbus calc cpu-evict` (../shared/design/CALC-CONTRACT.md, spec §5.5.2, §5.5.3).

Registered in koordbus.calc.CALCULATORS through `KINDS` (input type, function, and the summary and example `--help`
shows). Each runs one round of koordlet's eviction strategy with agent.evict_round: the gate-independent figures
(usage release, BE satisfaction release, allocatable release and what each pod would give back), one task per enabled
feature (its release and its candidates in order, or why the config is refused), and the victims the tasks pick
together. A usage release whose fields are missing is left out of the output (its `explain` says what it needs), so
that it reads as neither a figure nor a zero. Metrics must be finite numbers; anything else is malformed input (exit 2).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import msgspec

from agent import evict, evict_round
from agent import evict_strategy as strategies
from agent.evict_strategy import ThresholdStrategy
from koordbus.calc_errors import InputError
from schemas import kube, resources, vocab

Metric = int | float


class MemoryPodInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pod: kube.Pod
    memory_usage: Metric | None = None


class MemoryEvictInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """Lists and objects may be null (as Go writes an empty slice or map): null reads as empty."""

    feature_gates: dict[str, Any] | None = None
    node_slo: strategies.NodeSLO | None = msgspec.field(default=None, name="nodeSLO")
    node: kube.Node | None = None
    node_memory_usage: Metric | None = None
    pods: list[MemoryPodInput] | None = None


class CpuPodInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    pod: kube.Pod
    cpu_usage: Metric | None = None


class BeCpuSampleInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    usage: Metric = 0
    request: Metric = 0
    real_limit: Metric = 0
    count: int = 0
    """How many samples the window averaged (`current` has none)."""


class BeCpuInput(msgspec.Struct, frozen=True, kw_only=True):
    window: BeCpuSampleInput | None = None
    current: BeCpuSampleInput | None = None


class CpuEvictInput(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """As MemoryEvictInput, null reads as empty; a missing BE CPU figure is 0."""

    feature_gates: dict[str, Any] | None = None
    node_slo: strategies.NodeSLO | None = msgspec.field(default=None, name="nodeSLO")
    node: kube.Node | None = None
    collect_interval_seconds: int = 1
    be_cpu: BeCpuInput | None = msgspec.field(default=None, name="beCPU")
    node_cpu_usage: Metric | None = msgspec.field(default=None, name="nodeCPUUsage")
    pods: list[CpuPodInput] | None = None


def _finite(value: Metric | None, path: str) -> float | None:
    """The metric as a float; NaN and the infinities (YAML can write them) are malformed input."""
    if value is None:
        return None
    if not math.isfinite(value):
        raise InputError(f"{path}: Expected a finite number, got {value!r}")
    return value


def _pods(usages: Sequence[tuple[kube.Pod, Metric | None]], field: str) -> list[evict_round.EvictPod]:
    return [evict_round.evict_pod(pod, _finite(usage, f"$.pods[{i}].{field}")) for i, (pod, usage) in enumerate(usages)]


def _gates(raw: Mapping[str, Any] | None, features: Sequence[evict_round.Feature]) -> dict[str, bool]:
    """The kind's gates (default off); other keys are ignored whatever they hold."""
    gates: dict[str, bool] = {}
    for feature in features:
        value = (raw or {}).get(feature.name, False)
        if not isinstance(value, bool):
            raise InputError(f"$.featureGates.{feature.name}: Expected `bool`, got {type(value).__name__}")
        gates[feature.name] = value
    return gates


def _be_cpu(sample: BeCpuSampleInput | None, path: str) -> strategies.BeCpu:
    if sample is None:
        return strategies.BeCpu(usage=0.0, request=0.0, limit=0.0)

    def number(value: Metric, field: str) -> float:
        return float(_finite(value, f"{path}.{field}") or 0)

    return strategies.BeCpu(
        usage=number(sample.usage, "usage"),
        request=number(sample.request, "request"),
        limit=number(sample.real_limit, "realLimit"),
    )


class _Node:
    """What a kind reads of the node: capacity of its resource and allocatable."""

    def __init__(self, node: kube.Node | None, resource: str) -> None:
        self.present = node is not None
        self.capacity = kube.node_capacity(node).get(resource, 0) if node is not None else 0
        self.allocatable = kube.node_allocatable(node) if node is not None else {}

    def evaluable(self) -> bool:
        """koordlet skips the whole round without a node or without capacity of the kind's resource."""
        return self.present and self.capacity > 0


def _usage(
    strategy: ThresholdStrategy | None, node: _Node, used: float | None, *, cpu: bool
) -> strategies.UsageRelease | None:
    """The usage trigger's figure, when its fields are all there (whatever the gates, enable and checks say)."""
    if strategy is None or used is None or node.capacity <= 0:
        return None
    threshold = strategy.cpu_evict_threshold_percent if cpu else strategy.memory_evict_threshold_percent
    if threshold is None:
        return None
    lower = strategy.cpu_evict_lower_percent if cpu else strategy.memory_evict_lower_percent
    return strategies.usage_release(capacity=node.capacity, used=used, threshold=threshold, lower=lower)


def _allocatable(
    strategy: ThresholdStrategy | None, node: _Node, pods: Sequence[evict_round.EvictPod], *, cpu: bool
) -> evict_round.AllocatableRelease:
    """The allocatable figures, when the kind's thresholds, the priority threshold and a node are there."""
    none = evict_round.AllocatableRelease(release={}, pod_release=[None] * len(pods))
    if strategy is None or not node.present:
        return none
    if cpu:
        threshold, lower = (
            strategy.cpu_allocatable_evict_threshold_percent,
            strategy.cpu_allocatable_evict_lower_percent,
        )
    else:
        threshold = strategy.memory_allocatable_evict_threshold_percent
        lower = strategy.memory_allocatable_evict_lower_percent
    priority = strategy.allocatable_evict_priority_threshold
    if threshold is None or lower is None or priority is None:
        return none
    resource = resources.CPU if cpu else resources.MEMORY
    return evict_round.allocatable_release(
        pods, node.allocatable, resource=resource, threshold=threshold, lower=lower, priority_threshold=priority
    )


def _required(value: int | None) -> int:
    """A threshold the feature's config check has already required."""
    if value is None:
        raise AssertionError("checked before building the task")
    return value


def _tasks(
    outcome: evict_round.Round, keys: Sequence[str], entry: Callable[[int, str], dict[str, Any]]
) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for feature, task in outcome.tasks.items():
        if isinstance(task, str):
            out[feature] = {"error": task}
        else:
            candidates = [entry(i, feature) for i in task.candidates]
            out[feature] = {"release": task.release, "ledger": task.ledger, "candidates": candidates}
    return out


def _report(
    outcome: evict_round.Round,
    pods: Sequence[evict_round.EvictPod],
    alloc: evict_round.AllocatableRelease,
    entry: Callable[[int, str], dict[str, Any]],
) -> dict[str, Any]:
    keys = [p.key for p in pods]
    victims = [keys[i] for i in outcome.victims]
    return {
        "evict": bool(victims),
        "allocatableRelease": alloc.release,
        "allocatablePodRelease": {keys[i]: r for i, r in enumerate(alloc.pod_release) if r is not None},
        "victims": victims,
        "tasks": _tasks(outcome, keys, entry),
    }


def _explain_usage(
    what: str, usage: strategies.UsageRelease | None, capacity: int, used: Metric | None, threshold: int | None
) -> str:
    if usage is None:
        return f"not computed: needs capacity > 0 (is {capacity}), the node {what} usage and its threshold percent"
    head = f"node {what} {int(used or 0)} of {capacity} = {usage.percent}%"
    if not usage.triggered:
        return f"{head} < threshold {threshold}%: release 0"
    return (
        f"{head} ≥ threshold {threshold}%: release {capacity} × ({usage.percent} − lower {usage.lower}) / 100 = "
        f"{usage.release}"
    )


MEMORY_EVICT_HELP: Final = (
    "koordlet's memory eviction round: BEMemoryEvict, MemoryAllocatableEvict, MemoryEvict, the victims (spec §5.5.2)",
    '{"featureGates": {"BEMemoryEvict": true}, "nodeSLO": {"resourceUsedThresholdWithBE":\n'
    '       {"enable": true, "memoryEvictThresholdPercent": 70}},\n'
    '     "node": {"status": {"capacity": {"memory": "100Gi"}}}, "nodeMemoryUsage": 80000000000,\n'
    '     "pods": [{"pod": {"metadata": {"namespace": "ns", "name": "be",\n'
    '       "labels": {"koordinator.sh/qosClass": "BE"}}, "status": {"phase": "Running"}}, "memoryUsage": 9e9}]}',
)


def memory_evict(inp: MemoryEvictInput) -> dict[str, Any]:
    used = _finite(inp.node_memory_usage, "$.nodeMemoryUsage")
    pods = _pods([(p.pod, p.memory_usage) for p in inp.pods or ()], "memoryUsage")
    keys = [p.key for p in pods]
    node = _Node(inp.node, resources.MEMORY)
    strategy = inp.node_slo.resource_used_threshold_with_be if inp.node_slo is not None else None
    usage = _usage(strategy, node, used, cpu=False)
    alloc = _allocatable(strategy, node, pods, cpu=False)
    due = {resources.MEMORY: usage.release} if usage is not None and usage.triggered else {}

    def memory_used(i: int) -> Mapping[str, int]:
        return {resources.MEMORY: pods[i].used}

    def memory_request(p: evict_round.EvictPod) -> int:
        return evict_round.pod_request(p, resources.MEMORY)[1]

    def be_memory(s: ThresholdStrategy) -> evict_round.Task:
        order = evict_round.be_memory_order(pods)
        return evict_round.Task(ledger=evict_round.LEDGER_USED, release=due, candidates=order, amounts=memory_used)

    def memory_allocatable(s: ThresholdStrategy) -> evict_round.Task:
        threshold = _required(s.allocatable_evict_priority_threshold)
        order = evict_round.priority_order(
            pods, evict.MEMORY_ALLOCATABLE, priority_threshold=threshold, last_key=memory_request
        )
        return evict_round.Task(
            ledger=evict_round.LEDGER_REQUESTED,
            release=alloc.release,
            candidates=order,
            amounts=alloc.pod_release.__getitem__,
        )

    def memory(s: ThresholdStrategy) -> evict_round.Task:
        threshold = _required(s.evict_enabled_priority_threshold)
        order = evict_round.priority_order(pods, evict.MEMORY, priority_threshold=threshold, last_key=lambda p: p.used)
        return evict_round.Task(ledger=evict_round.LEDGER_USED, release=due, candidates=order, amounts=memory_used)

    features = [
        evict_round.Feature(name=evict.BE_MEMORY, check=strategies.check_be_memory, build=be_memory),
        evict_round.Feature(
            name=evict.MEMORY_ALLOCATABLE, check=strategies.check_memory_allocatable, build=memory_allocatable
        ),
        evict_round.Feature(name=evict.MEMORY, check=strategies.check_memory, build=memory),
    ]
    outcome = evict_round.evaluate(
        features, gates=_gates(inp.feature_gates, features), slo=inp.node_slo, evaluable=node.evaluable(), keys=keys
    )

    def entry(i: int, feature: str) -> dict[str, Any]:
        out: dict[str, Any] = {"pod": keys[i], "memoryUsed": pods[i].used}
        if feature != evict.BE_MEMORY:
            out["memoryRequest"] = memory_request(pods[i])
        return out

    threshold = strategy.memory_evict_threshold_percent if strategy is not None else None
    return {
        **({"release": usage.release} if usage is not None else {}),
        **_report(outcome, pods, alloc, entry),
        "explain": {
            "release": _explain_usage("memory", usage, node.capacity, used, threshold),
            "allocatableRelease": alloc.steps,
        },
    }


CPU_EVICT_HELP: Final = (
    "koordlet's CPU eviction round: BECPUEvict, CPUAllocatableEvict, CPUEvict and the victims (spec §5.5.3)",
    '{"featureGates": {"CPUEvict": true}, "nodeSLO": {"resourceUsedThresholdWithBE":\n'
    '       {"enable": true, "cpuEvictThresholdPercent": 80, "evictEnabledPriorityThreshold": 5999}},\n'
    '     "node": {"status": {"capacity": {"cpu": "10"}}}, "nodeCPUUsage": 9000,\n'
    '     "pods": [{"pod": {"metadata": {"namespace": "ns", "name": "batch", "labels":\n'
    '       {"koordinator.sh/eviction-enabled": "true"}}, "spec": {"priority": 5500},\n'
    '       "status": {"phase": "Running"}}, "cpuUsage": 2000}]}',
)


def cpu_evict(inp: CpuEvictInput) -> dict[str, Any]:
    used = _finite(inp.node_cpu_usage, "$.nodeCPUUsage")
    be_group = inp.be_cpu or BeCpuInput()
    window = _be_cpu(be_group.window, "$.beCPU.window")
    current = _be_cpu(be_group.current, "$.beCPU.current")
    pods = _pods([(p.pod, p.cpu_usage) for p in inp.pods or ()], "cpuUsage")
    keys = [p.key for p in pods]
    node = _Node(inp.node, resources.CPU)
    strategy = inp.node_slo.resource_used_threshold_with_be if inp.node_slo is not None else None
    satisfaction = strategies.Satisfaction(release=0, reason="no resourceUsedThresholdWithBE")
    if strategy is not None:
        satisfaction = strategies.be_satisfaction_release(
            strategy,
            window=window,
            count=be_group.window.count if be_group.window is not None else 0,
            current=current,
            interval=inp.collect_interval_seconds,
            allocatable=strategies.be_allocatable_limit(node.allocatable if node.present else None),
        )
    be_release = satisfaction.release
    usage = _usage(strategy, node, used, cpu=True)
    alloc = _allocatable(strategy, node, pods, cpu=True)

    def cpu_request(p: evict_round.EvictPod) -> int:
        return evict_round.pod_request(p, resources.CPU)[1]

    def be_cpu(s: ThresholdStrategy) -> evict_round.Task:
        return evict_round.Task(
            ledger=evict_round.LEDGER_REQUESTED,
            release={vocab.BATCH_CPU: be_release} if be_release > 0 else {},
            candidates=evict_round.be_cpu_order(pods),
            amounts=lambda i: {vocab.BATCH_CPU: evict_round.batch_cpu_request(pods[i].pod)},
        )

    def cpu_allocatable(s: ThresholdStrategy) -> evict_round.Task:
        threshold = _required(s.allocatable_evict_priority_threshold)
        order = evict_round.priority_order(
            pods, evict.CPU_ALLOCATABLE, priority_threshold=threshold, last_key=cpu_request
        )
        return evict_round.Task(
            ledger=evict_round.LEDGER_REQUESTED,
            release=alloc.release,
            candidates=order,
            amounts=alloc.pod_release.__getitem__,
        )

    def cpu(s: ThresholdStrategy) -> evict_round.Task:
        threshold = _required(s.evict_enabled_priority_threshold)
        order = evict_round.priority_order(
            pods, evict_round.CPU_EVICT, priority_threshold=threshold, last_key=lambda p: p.used
        )
        return evict_round.Task(
            ledger=evict_round.LEDGER_USED,
            release={resources.CPU: usage.release} if usage is not None and usage.triggered else {},
            candidates=order,
            amounts=lambda i: {resources.CPU: pods[i].used},
        )

    features = [
        evict_round.Feature(name=evict.BE_CPU, check=strategies.check_be_cpu, build=be_cpu),
        evict_round.Feature(name=evict.CPU_ALLOCATABLE, check=strategies.check_cpu_allocatable, build=cpu_allocatable),
        evict_round.Feature(name=evict_round.CPU_EVICT, check=strategies.check_cpu, build=cpu),
    ]
    outcome = evict_round.evaluate(
        features, gates=_gates(inp.feature_gates, features), slo=inp.node_slo, evaluable=node.evaluable(), keys=keys
    )

    def entry(i: int, feature: str) -> dict[str, Any]:
        p = pods[i]
        if feature == evict.BE_CPU:
            request = evict_round.batch_cpu_request(p.pod)
            return {"pod": keys[i], "cpuUsed": p.used, "cpuRequest": request, "cpuUsage": evict_round.be_cpu_usage(p)}
        return {"pod": keys[i], "cpuUsed": p.used, "cpuRequest": cpu_request(p)}

    threshold = strategy.cpu_evict_threshold_percent if strategy is not None else None
    return {
        "release": be_release,
        **({"usageRelease": usage.release} if usage is not None else {}),
        **_report(outcome, pods, alloc, entry),
        "explain": {
            "release": satisfaction.reason,
            "usageRelease": _explain_usage("cpu", usage, node.capacity, used, threshold),
            "allocatableRelease": alloc.steps,
        },
    }


Kind = tuple[type[Any], Callable[[Any], dict[str, Any]], str, str]
KINDS: Final[Mapping[str, Kind]] = {
    "memory-evict": (MemoryEvictInput, memory_evict, *MEMORY_EVICT_HELP),
    "cpu-evict": (CpuEvictInput, cpu_evict, *CPU_EVICT_HELP),
}
"""The kinds for koordbus.calc.CALCULATORS: input type, function, summary and example."""
