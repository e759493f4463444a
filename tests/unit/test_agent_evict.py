"""agent.evict (spec §5.5.2–5.5.3): the memory trigger and amount, BEMemoryEvict's and MemoryEvict's orders, the
eviction-policy annotation, pending evictions, the ×1000 fix, BE CPU satisfaction and its victims."""

from __future__ import annotations

import json

import msgspec

from agent import evict
from agent.actuate import NodePod
from agent.allocatable_watch import allocatable_in_force
from schemas import kube
from schemas.noderesource import NodeResourceComputed
from tests.unit.test_agent_actuate import be_pod

GI = 1 << 30


def pod(
    n: int,
    *,
    label: str = "BE",
    priority: int | None = None,
    name: str | None = None,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    batch_cpu: str = "1000",
) -> NodePod:
    base = be_pod(
        f"3f1e2d3c-0000-4000-8000-{n:012d}",
        label=label,
        name=name or f"pod-{n}",
        annotation={"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": batch_cpu}}}},
    )
    meta = base.pod.metadata
    changed = msgspec.structs.replace(
        base.pod,
        metadata=msgspec.structs.replace(
            meta, labels={**meta.labels, **(labels or {})}, annotations={**meta.annotations, **(annotations or {})}
        ),
        spec=msgspec.structs.replace(base.pod.spec, priority=priority),
    )
    return NodePod(pod=changed, containers=base.containers)


def test_below_the_threshold_nobody_is_evicted() -> None:
    victims, why = evict.memory_victims(
        features=frozenset({evict.BE_MEMORY}),
        capacity=100 * GI,
        node_used=69 * GI,
        pod_memory={},
        pods=[pod(1)],
        threshold_percent=70,
        lower_percent=None,
        priority_threshold=None,
    )
    assert victims == [] and "69% < threshold 70%" in why


def test_be_memory_evicts_biggest_first_until_enough_is_released() -> None:
    pods = [pod(1), pod(2), pod(3), pod(4, label="LS"), pod(5, priority=5000)]
    usage = {pods[0].uid: 2 * GI, pods[1].uid: 5 * GI, pods[2].uid: 0, pods[3].uid: 30 * GI, pods[4].uid: 1 * GI}
    victims, why = evict.memory_victims(
        features=frozenset({evict.BE_MEMORY}),
        capacity=100 * GI,
        node_used=75 * GI,
        pod_memory=usage,
        pods=pods,
        threshold_percent=70,
        lower_percent=None,  # threshold − 2
        priority_threshold=None,
    )
    # release 100 × (75 − 68)% = 7 GiB: pod-2 (5) then pod-1 (2); the LS pod is never a BE candidate
    assert [v.pod.pod.metadata.name for v in victims] == ["pod-2", "pod-1"]
    assert sum(v.released for v in victims) == 7 * GI
    assert "release 7516192768 bytes" in why and victims[0].reason.startswith("BEMemoryEvict")


def test_be_memory_order_priority_then_size_then_name_descending() -> None:
    pods = [pod(1, name="a"), pod(2, name="b"), pod(3, priority=-5, name="c")]
    usage = {p.uid: GI for p in pods}
    victims, _ = evict.memory_victims(
        features=frozenset({evict.BE_MEMORY}),
        capacity=10 * GI,
        node_used=10 * GI,
        pod_memory=usage,
        pods=pods,
        threshold_percent=70,
        lower_percent=10,
        priority_threshold=None,
    )
    assert [v.pod.pod.metadata.name for v in victims] == ["c", "b", "a"]


def test_the_eviction_policy_annotation_and_pending_evictions() -> None:
    only_cpu = pod(1, annotations={evict.EVICTION_POLICY: json.dumps([evict.BE_CPU])})
    pending, other = pod(2), pod(3)
    usage = {only_cpu.uid: 9 * GI, pending.uid: 3 * GI, other.uid: 3 * GI}
    victims, why = evict.memory_victims(
        features=frozenset({evict.BE_MEMORY}),
        capacity=100 * GI,
        node_used=74 * GI,
        pod_memory=usage,
        pods=[only_cpu, pending, other],
        threshold_percent=70,
        lower_percent=None,
        priority_threshold=None,
        pending=[pending.uid],
    )
    # release 6 GiB, 3 already pending: the other pod is enough; the annotated one is not BEMemoryEvict's
    assert [v.pod.uid for v in victims] == [other.uid] and "3221225472 already pending" in why


def test_memory_evict_counts_bytes_not_bytes_times_1000() -> None:
    enabled = {evict.EVICTION_ENABLED: "true"}
    pods = [
        pod(1, label="LS", priority=3000, labels=enabled),
        pod(2, label="LS", priority=1000, labels=enabled),
        pod(3, label="LS", priority=1000, labels=enabled, annotations={evict.EVICTION_PRIORITY: "-1"}),
        pod(4, label="LS", priority=9000, labels=enabled),  # above the priority threshold
        pod(5, label="LS", priority=1000),  # not eviction-enabled
    ]
    usage = {p.uid: 2 * GI for p in pods}
    victims, _ = evict.memory_victims(
        features=frozenset({evict.MEMORY}),
        capacity=100 * GI,
        node_used=73 * GI,
        pod_memory=usage,
        pods=pods,
        threshold_percent=70,
        lower_percent=68,
        priority_threshold=5000,
    )
    # 5 GiB to release: Koordinator would stop after one pod (2 GiB × 1000); we take three
    assert [v.pod.uid for v in victims] == [pods[2].uid, pods[1].uid, pods[0].uid]


def _samples(usage: int, request: int, limit: int, n: int = 3) -> list[evict.CpuSample]:
    return [evict.CpuSample(at=float(i), usage=usage, request=request, limit=limit) for i in range(n)]


def test_cpu_satisfaction_release() -> None:
    options = {"window_seconds": 3, "collect_interval": 1, "lower_percent": 60, "upper_percent": 80}
    # satisfaction 2000/4000 = 0.5 ≤ 0.6, BE uses 95% of its limit: release 4000 × (0.8 − 0.5) = 1200
    release, why = evict.cpu_satisfaction_release(_samples(1900, 4000, 2000), **options)
    assert release == 1200 and "satisfaction" in why
    assert evict.cpu_satisfaction_release(_samples(1000, 4000, 2000), **options)[0] == 0  # BE not busy
    assert evict.cpu_satisfaction_release(_samples(3000, 4000, 3000), **options)[0] == 0  # satisfied (0.75)
    assert evict.cpu_satisfaction_release(_samples(1900, 4000, 2000, n=0), **options)[0] == 0
    thin = evict.cpu_satisfaction_release(_samples(1900, 4000, 2000, n=1), **{**options, "window_seconds": 30})
    assert thin[0] == 0 and "third" in thin[1]
    # request grew in the latest sample: the lesser of the average's and the latest's release
    moved = [*_samples(1900, 4000, 2000, n=2), evict.CpuSample(at=2.0, usage=1900, request=6000, limit=2000)]
    assert evict.cpu_satisfaction_release(moved, **options)[0] == min(int(4666 * (0.8 - 2000 / 4666)), 2800)
    # under one core of limit, usage counts as high enough
    assert evict.cpu_satisfaction_release(_samples(10, 2000, 500), **options)[0] == int(2000 * (0.8 - 0.25))


def test_cpu_victims_by_priority_then_usage_over_request() -> None:
    busy, idle, low = pod(1, batch_cpu="1000"), pod(2, batch_cpu="1000"), pod(3, priority=-10, batch_cpu="500")
    ls = pod(4, label="LS")
    usage = {busy.uid: 900, idle.uid: 100, low.uid: 10}
    victims = evict.cpu_victims([busy, idle, low, ls], usage, 1200, reason="r")
    assert [v.pod.uid for v in victims] == [low.uid, busy.uid]
    assert [v.released for v in victims] == [500, 1000]
    assert evict.be_request_milli([busy, idle, low, ls]) == 2500
    assert evict.cpu_victims([busy, idle], usage, 1200, pending=[busy.uid], reason="r")[0].pod.uid == idle.uid


def test_unknown_types_are_not_pods() -> None:
    assert isinstance(pod(1).pod, kube.Pod)


def test_node_cpu_victims_average_the_window_and_skip_what_is_taken() -> None:
    """CPUEvict (§5.5.3): int(avg) × 100 / capacity against the threshold; release capacity × (percent − lower)."""
    a, b = _cpu_evict_pod("a", 1000), _cpu_evict_pod("b", 1000)
    window = [(1.0, 6000), (2.0, 8000)]  # avg 7000m of 8000m = 87 %
    victims, why = evict.node_cpu_victims(
        capacity_milli=8000,
        window=window,
        pod_cpu={a.uid: 900, b.uid: 2000},
        pods=[a, b],
        threshold_percent=80,
        lower_percent=None,  # threshold − 2 = 78 %: release 8000 × 9 / 100 = 720m
        priority_threshold=5000,
    )
    assert "node CPU 87% over 2 samples" in why and "release 720m (to 78%)" in why
    assert [v.pod.uid for v in victims] == [b.uid]  # the most CPU first; 2000m covers 720m
    victims, _ = evict.node_cpu_victims(
        capacity_milli=8000, window=window, pod_cpu={a.uid: 900, b.uid: 2000}, pods=[a, b], threshold_percent=80,
        lower_percent=None, priority_threshold=5000, taken=[b.uid],
    )  # fmt: skip
    assert [v.pod.uid for v in victims] == [a.uid]
    under, why = evict.node_cpu_victims(
        capacity_milli=8000, window=[(1.0, 6000)], pod_cpu={a.uid: 900}, pods=[a], threshold_percent=80,
        lower_percent=None, priority_threshold=5000,
    )  # fmt: skip
    assert under == [] and why == "node CPU 75% < threshold 80%"


def _cpu_evict_pod(name: str, priority: int) -> NodePod:
    pod = msgspec.convert(
        {
            "metadata": {
                "name": name,
                "namespace": "default",
                "uid": f"uid-{name}",
                "labels": {"koordinator.sh/eviction-enabled": "true"},
            },
            "spec": {"priority": priority},
            "status": {"phase": "Running"},
        },
        kube.Pod,
    )
    return NodePod(pod=pod)


def test_the_allocatable_in_force_is_the_last_due_write() -> None:
    def decision(write_due: bool) -> NodeResourceComputed:
        return NodeResourceComputed(
            node="n1",
            computed_at=1.0,
            trigger=("nodemetric",),
            outcome="computed",
            resources={"kubernetes.io/batch-cpu": 9000, "kubernetes.io/batch-memory": None},
            write_due=write_due,
            write_reason="first write" if write_due else "up to date",
            last_write_resources={"kubernetes.io/batch-cpu": 8000, "kubernetes.io/batch-memory": 2**30},
        )

    assert allocatable_in_force(decision(True)) == {"kubernetes.io/batch-cpu": 9000}  # None: removed
    assert allocatable_in_force(decision(False)) == {
        "kubernetes.io/batch-cpu": 8000,
        "kubernetes.io/batch-memory": 2**30,
    }
