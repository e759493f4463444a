"""Eviction end to end: the agent's memory and BE CPU satisfaction loops publish PodEvictionRequested, the bridge's
EvictionExecutor carries them out through the (fake) Eviction API with the pod's uid as a precondition; cool-downs,
pending evictions, dry-run, the fail-safe, PodDisruptionBudgets, stale requests, and the local kill fallback on this
machine's real cgroup v1 filesystem."""

from __future__ import annotations

import logging
import os
import subprocess
import uuid
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kubernetes_asyncio.client import ApiClient

from agent import actuate
from agent.core import PodSample, Tick
from bus import streams, subjects
from bus.memory import MemoryBus
from schemas.node import PodRef
from schemas.noderesource import NodeResourceComputed
from schemas.qos import EVICTION_DECODER, PodEvictionRequested
from services.common.metrics import new_registry
from services.k8s.eviction_executor import EvictionExecutor, KubeEvictor
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_agent_qos import (
    NODE,
    T0,
    AwayBus,
    Clock,
    StaticPods,
    cpuset_tree,
    loops,
    slo_bus,
    sys_tree,
    v1_tree,
)
from tests.support.waiting import eventually
from tests.unit.test_agent_actuate import CID, GI, be_pod

BIG_UID = "3f1e2d3c-0000-4000-8000-0000000000b1"
SMALL_UID = "3f1e2d3c-0000-4000-8000-0000000000b2"
LS_ONLY_UID = "3f1e2d3c-0000-4000-8000-0000000000b3"
MEMORY_SPEC = {"resourceUsedThresholdWithBE": {"enable": True, "memoryEvictThresholdPercent": 70}}


def memory_tick(at: float, *, node_gib: float, pods: dict[str, float]) -> Tick:
    samples = tuple(
        PodSample(pod=PodRef(uid=uid, kube_qos="BestEffort"), sample=(at, 0.5, int(gib * GI)), memory_with_page_cache=0)
        for uid, gib in pods.items()
    )
    return Tick(at=at, node=(at, 4.0, int(node_gib * GI)), node_memory_with_page_cache=0, system=None, pods=samples)


def pod_object(node_pod: actuate.NodePod, *, node: str = NODE) -> dict[str, Any]:
    """The pod as the API server holds it: bound to `node` (the agent's, by default)."""
    obj: dict[str, Any] = msgspec.to_builtins(node_pod.pod)
    obj["spec"]["nodeName"] = node
    return obj


async def requests(bus: MemoryBus) -> list[PodEvictionRequested]:
    stored = await bus.read_recent(streams.KOORD_NODE, subjects.NODE_EVICTION_ALL, since=0, limit=100)
    return [EVICTION_DECODER.decode(d.data) for d in stored]


def setup(tmp_path: Path, bus: Any, pods: list[actuate.NodePod], clock: Clock, **settings: Any) -> Any:
    v1_tree(tmp_path / "cg")
    proc = tmp_path / "proc"
    proc.mkdir(exist_ok=True)
    (proc / "meminfo").write_text(f"MemTotal: {100 * GI // 1024} kB\nMemFree: 0 kB\nMemAvailable: 0 kB\n")
    return loops(
        tmp_path,
        bus,
        StaticPods(*pods),
        cgroup_root=tmp_path / "cg",
        clock=clock,
        sys_root=str(sys_tree(tmp_path / "sys")),
        evict_features=settings.pop("evict_features", "BEMemoryEvict"),
        **settings,
    )


async def test_memory_pressure_evicts_the_biggest_be_pod_through_the_bridge(
    tmp_path: Path, kube_api: FakeKubeApi, kube_client: ApiClient
) -> None:
    big, small = be_pod(BIG_UID, name="big"), be_pod(SMALL_UID, name="small")
    for node_pod in (big, small):
        kube_api.put("pods", pod_object(node_pod))
    bus = await slo_bus(MEMORY_SPEC)
    executor = EvictionExecutor(bus, KubeEvictor(kube_client), registry=new_registry(), clock=lambda: T0 + 1)
    await executor.start()
    clock = Clock()
    qos_loops = setup(tmp_path, bus, [big, small], clock)
    usage = [memory_tick(T0, node_gib=74, pods={BIG_UID: 6, SMALL_UID: 2})]
    qos_loops._usage = lambda: usage[0]
    try:
        events = {e.loop: e for e in await qos_loops.round()}
        (change,) = events["memory-evict"].changes
        assert change.path == "pods/jobs/big" and change.after == "eviction requested"
        assert "74% ≥ threshold 70%: release 6442450944 bytes" in change.reason
        (request,) = await requests(bus)
        assert (request.name, request.uid, request.feature) == ("big", BIG_UID, "BEMemoryEvict")
        await eventually(lambda: kube_api.get("Pod", "big", "jobs") is None)
        assert kube_api.get("Pod", "small", "jobs") is not None
        # Within the 4 s cool-down nothing more; after it the evicted pod (still listed) counts as released.
        clock.now += 2
        usage[0] = memory_tick(clock.now, node_gib=74, pods={BIG_UID: 6, SMALL_UID: 2})
        assert "memory-evict" not in {e.loop for e in await qos_loops.round()}
        clock.now += 3
        usage[0] = memory_tick(clock.now, node_gib=74, pods={BIG_UID: 6, SMALL_UID: 2})
        await qos_loops.round()
        assert len(await requests(bus)) == 1
    finally:
        await executor.stop()


async def test_dry_run_and_failsafe_request_no_eviction(tmp_path: Path) -> None:
    big = be_pod(BIG_UID, name="big")
    bus = await slo_bus(MEMORY_SPEC)
    clock = Clock()
    qos_loops = setup(tmp_path, bus, [big], clock, mode="dry-run")
    qos_loops._usage = lambda: memory_tick(clock.now, node_gib=80, pods={BIG_UID: 6})
    events = {e.loop: e for e in await qos_loops.round()}
    assert events["memory-evict"].changes[0].after == "eviction would be requested"
    assert await requests(bus) == []
    # The control plane silent past the fail-safe: no new evictions at all.
    away = setup(tmp_path / "away", AwayBus(), [big], clock, failsafe_after=30)
    away._usage = lambda: memory_tick(clock.now, node_gib=80, pods={BIG_UID: 6})
    clock.now += 31
    away._usage = lambda: memory_tick(clock.now, node_gib=80, pods={BIG_UID: 6})
    await away.round()
    assert away.failsafe_active and away.stats.evictions_requested == 0


async def test_the_executor_answers_blocked_replaced_and_expired(kube_api: FakeKubeApi, kube_client: ApiClient) -> None:
    pod = be_pod(BIG_UID, name="big")
    kube_api.put("pods", pod_object(pod))
    now = [T0]
    bus = MemoryBus()
    await bus.ensure_streams([streams.node_stream()])
    executor = EvictionExecutor(bus, KubeEvictor(kube_client), registry=new_registry(), clock=lambda: now[0])

    def request(uid: str, at: float, node: str = NODE) -> PodEvictionRequested:
        return PodEvictionRequested(
            node=node, at=at, namespace="jobs", name="big", uid=uid, feature="BEMemoryEvict", reason="test"
        )

    kube_api.eviction_blocked.add(("jobs", "big"))
    assert await executor.execute(request(BIG_UID, T0)) == "blocked"
    kube_api.eviction_blocked.clear()
    assert await executor.execute(request(str(uuid.uuid4()), T0)) == "replaced"  # a new pod took the name
    assert kube_api.get("Pod", "big", "jobs") is not None
    # another node's agent cannot evict this node's pod, whatever it names
    assert await executor.execute(request(BIG_UID, T0, node="other-node")) == "wrong-node"
    assert kube_api.get("Pod", "big", "jobs") is not None
    now[0] = T0 + 3600
    assert await executor.execute(request(BIG_UID, T0)) == "expired"
    now[0] = T0
    assert await executor.execute(request(BIG_UID, T0)) == "evicted"
    assert await executor.execute(request(BIG_UID, T0)) == "gone"


async def test_a_flood_of_expired_requests_is_not_a_flood_of_warnings(
    kube_client: ApiClient, caplog: pytest.LogCaptureFixture
) -> None:
    """The soak at 1,000 simulated nodes: every eviction request delivered late was its own WARNING line, hundreds a
    minute. Each answer now goes to DEBUG (a failed one to WARNING) and a minute's worth to one INFO summary."""
    bus = MemoryBus()
    await bus.ensure_streams([streams.node_stream()])
    executor = EvictionExecutor(bus, KubeEvictor(kube_client), registry=new_registry(), clock=lambda: T0 + 3600)
    with caplog.at_level(logging.DEBUG, logger="services.k8s.eviction_executor"):
        for i in range(200):
            request = PodEvictionRequested(
                node="n1", at=T0, namespace="jobs", name=f"p{i}", uid=str(uuid.uuid4()), feature="x", reason="late"
            )
            assert await executor.execute(request) == "expired"
    mine = [r for r in caplog.records if r.name == "services.k8s.eviction_executor"]
    assert len(mine) == 200 and all(r.levelno == logging.DEBUG for r in mine)


async def test_be_cpu_satisfaction_evicts_the_busiest_be_pod(tmp_path: Path) -> None:
    spec = {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuEvictBESatisfactionLowerPercent": 60,
            "cpuEvictBESatisfactionUpperPercent": 80,
            "cpuEvictTimeWindowSeconds": 6,
        }
    }
    batch = {"containers": {"main": {"requests": {"kubernetes.io/batch-cpu": "2000"}}}}
    busy = be_pod(BIG_UID, name="busy", annotation=batch)
    calm = be_pod(SMALL_UID, name="calm", annotation=batch)
    bus = await slo_bus(spec)
    clock = Clock()
    qos_loops = setup(tmp_path, bus, [busy, calm], clock, evict_features="BECPUEvict")
    cpuset_tree(tmp_path / "cg")
    # CPU suppress leaves BE 2 CPUs (8000m × 65% − system 3600m = 1600m → the minimum, 2); BE requests 4 cores and
    # uses 1.9 of its 2: satisfaction 0.5 ≤ 0.6 → release 4000m × (0.8 − 0.5) = 1200m

    def cpu_tick(at: float) -> Tick:
        def sample(uid: str, cores: float) -> PodSample:
            return PodSample(
                pod=PodRef(uid=uid, kube_qos="BestEffort"), sample=(at, cores, GI), memory_with_page_cache=0
            )

        return Tick(at=at, node=(at, 5.5, 10 * GI), node_memory_with_page_cache=0, system=None,
                    pods=(sample(BIG_UID, 1.5), sample(SMALL_UID, 0.4)))  # fmt: skip

    qos_loops._usage = lambda: cpu_tick(clock.now)
    assert "cpu-evict" not in {e.loop for e in await qos_loops.round()}  # one sample: under a third of the window
    clock.now += 1
    events = {e.loop: e for e in await qos_loops.round()}
    (change,) = events["cpu-evict"].changes
    assert change.path == "pods/jobs/busy" and "release 4000m × (80% − 0.50) = 1200m" in change.reason
    assert [r.feature for r in await requests(bus)] == ["BECPUEvict"]


async def test_node_cpu_eviction_picks_eviction_enabled_pods_by_cpu_used(tmp_path: Path) -> None:
    """CPUEvict (issue 23 point 2, §5.5.3): the node's CPU averaged over the window at 90 % of 8 cores ≥ the 80 %
    threshold → release 8000m × (90 − 70) % = 1600m from pods labelled eviction-enabled at or under the priority
    threshold, the most CPU first; an LS pod without the label is never picked; the 20 s cool-down holds."""
    spec = {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "cpuEvictThresholdPercent": 80,
            "cpuEvictLowerPercent": 70,
            "evictEnabledPriorityThreshold": 5000,
            "cpuEvictTimeWindowSeconds": 3,
        }
    }

    def enabled(p: actuate.NodePod, priority: int) -> actuate.NodePod:
        meta = msgspec.structs.replace(
            p.pod.metadata, labels={**p.pod.metadata.labels, "koordinator.sh/eviction-enabled": "true"}
        )
        spec_ = msgspec.structs.replace(p.pod.spec, priority=priority)
        return actuate.NodePod(pod=msgspec.structs.replace(p.pod, metadata=meta, spec=spec_), containers=p.containers)

    hungry = enabled(be_pod(BIG_UID, name="hungry", label="LS", kube_qos="Burstable"), 1000)
    modest = enabled(be_pod(SMALL_UID, name="modest", label="LS", kube_qos="Burstable"), 1000)
    protected = be_pod(LS_ONLY_UID, name="web", label="LS", kube_qos="Burstable")  # not eviction-enabled
    bus = await slo_bus(spec)
    clock = Clock()
    qos_loops = setup(tmp_path, bus, [hungry, modest, protected], clock, evict_features="CPUEvict")

    def cpu_tick(at: float) -> Tick:
        def sample(uid: str, cores: float) -> PodSample:
            return PodSample(
                pod=PodRef(uid=uid, kube_qos="Burstable"), sample=(at, cores, GI), memory_with_page_cache=0
            )

        return Tick(at=at, node=(at, 7.2, 10 * GI), node_memory_with_page_cache=0, system=None,
                    pods=(sample(BIG_UID, 1.0), sample(SMALL_UID, 0.8), sample(LS_ONLY_UID, 5.0)))  # fmt: skip

    qos_loops._usage = lambda: cpu_tick(clock.now)
    events = {e.loop: e for e in await qos_loops.round()}
    changes = events["cpu-evict"].changes
    # hungry (1000m) then modest (800m): 1800m ≥ 1600m; web uses most but is not eviction-enabled
    assert [c.path for c in changes] == ["pods/jobs/hungry", "pods/jobs/modest"]
    assert "node CPU 90% over 1 samples ≥ threshold 80%: release 1600m (to 70%)" in changes[0].reason
    assert [r.feature for r in await requests(bus)] == ["CPUEvict", "CPUEvict"]
    clock.now += 5  # within the 20 s cool-down: nothing more, though the node is still hot
    assert "cpu-evict" not in {e.loop for e in await qos_loops.round()}


async def test_batch_pods_past_a_shrunk_batch_allocatable_are_evicted_by_request(tmp_path: Path) -> None:
    """MemoryAllocatableEvict (issue 23 point 2, §5.5.2): the node's batch allocatable read from its last due
    batch/mid decision (16 GiB of batch-memory); BE pods request 12 + 8 = 20 GiB = 125 % > the 110 % threshold →
    release (125 − 100) % × 16 GiB = 4 GiB, the eviction-enabled pod with the largest request last-key first."""
    spec = {
        "resourceUsedThresholdWithBE": {
            "enable": True,
            "memoryAllocatableEvictThresholdPercent": 110,
            "memoryAllocatableEvictLowerPercent": 100,
            "allocatableEvictPriorityThreshold": 6999,
        }
    }

    def batch_pod(uid: str, name: str, gib: int) -> actuate.NodePod:
        requests = {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": f"{gib}Gi"}
        p = be_pod(uid, name=name, annotation={"containers": {"main": {"requests": requests}}})
        document = msgspec.to_builtins(p.pod)
        document["metadata"]["labels"]["koordinator.sh/eviction-enabled"] = "true"
        document["metadata"]["labels"]["koordinator.sh/priority-class"] = "koord-batch"
        document["spec"]["priority"] = 5500
        document["spec"]["containers"] = [{"name": "main", "resources": {"requests": requests}}]
        return actuate.NodePod(pod=msgspec.convert(document, type(p.pod)), containers=p.containers)

    big, small = batch_pod(BIG_UID, "big", 12), batch_pod(SMALL_UID, "small", 8)
    bus = await slo_bus(spec)
    await bus.ensure_streams([streams.noderesource_stream()])
    decided = NodeResourceComputed(
        node=NODE,
        computed_at=T0,
        trigger=("nodemetric",),
        outcome="computed",
        resources={"kubernetes.io/batch-cpu": 8000, "kubernetes.io/batch-memory": 16 * GI},
        write_due=True,
        write_reason="first write",
    )
    await bus.publish(subjects.noderesource_computed(NODE), msgspec.json.encode(decided), msg_id="decision")
    clock = Clock()
    qos_loops = setup(tmp_path, bus, [big, small], clock, evict_features="MemoryAllocatableEvict")
    qos_loops._usage = lambda: memory_tick(clock.now, node_gib=30, pods={BIG_UID: 6, SMALL_UID: 5})
    events = {e.loop: e for e in await qos_loops.round()}
    (change,) = events["memory-evict"].changes
    assert change.path == "pods/jobs/big"  # 12 GiB covers the 4 GiB release
    assert "MemoryAllocatableEvict: kubernetes.io/batch-memory: (" in change.reason
    assert [r.feature for r in await requests(bus)] == ["MemoryAllocatableEvict"]
    assert qos_loops.allocatable.allocatable == {"kubernetes.io/batch-cpu": 8000, "kubernetes.io/batch-memory": 16 * GI}


@pytest.mark.cgroup
async def test_local_kill_when_the_bus_is_away_on_real_cgroup_v1(tmp_path: Path) -> None:
    root = Path("/sys/fs/cgroup")
    if (root / "cgroup.controllers").exists() or not all(os.access(root / h, os.W_OK) for h in ("cpu", "cpuacct")):
        pytest.skip("needs a writable cgroup v1 filesystem at /sys/fs/cgroup")
    parent = f"koordbus-test-{uuid.uuid4().hex[:12]}"
    container = root / "cpu" / parent / f"kubepods/besteffort/pod{BIG_UID}" / CID
    victim = subprocess.Popen(["sleep", "600"])  # noqa: ASYNC220 (started once, killed in finally)
    tops = [root / h / parent for h in ("cpu", "cpuacct", "memory")]
    try:
        try:
            for hierarchy in ("cpu", "cpuacct", "memory"):
                (root / hierarchy / parent / f"kubepods/besteffort/pod{BIG_UID}" / CID).mkdir(parents=True)
            (container / "cgroup.procs").write_text(str(victim.pid))
        except OSError as e:
            pytest.skip(f"the kernel refuses new cgroups under {root}: {e}")
        proc = tmp_path / "proc"
        proc.mkdir()
        (proc / "meminfo").write_text(f"MemTotal: {100 * GI // 1024} kB\nMemFree: 0 kB\nMemAvailable: 0 kB\n")
        clock = Clock()
        qos_loops = loops(
            tmp_path,
            AwayBus(),
            StaticPods(be_pod(BIG_UID, name="big")),
            cgroup_root=root,
            parent=parent,
            clock=clock,
            sys_root=str(sys_tree(tmp_path / "sys")),
            evict_features="BEMemoryEvict",
            evict_locally=True,
        )
        qos_loops.slo.spec = MEMORY_SPEC  # the last good NodeSLO (the bus is away)
        qos_loops._usage = lambda: memory_tick(clock.now, node_gib=90, pods={BIG_UID: 6})
        await qos_loops.round()
        assert victim.wait(timeout=10) == -9
        assert qos_loops.stats.evictions_killed_locally == 1
    finally:
        victim.kill()
        victim.wait()
        for top in tops:
            if top.exists():
                for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                    directory.rmdir()
                top.rmdir()


async def test_a_request_naming_another_node_than_its_subject_is_dead_lettered_not_executed(
    kube_api: FakeKubeApi, kube_client: ApiClient
) -> None:
    kube_api.put("pods", pod_object(be_pod(BIG_UID, name="big"), node="victim-node"))
    bus = MemoryBus()
    await bus.ensure_streams([streams.node_stream(), streams.dlq_stream()])
    executor = EvictionExecutor(bus, KubeEvictor(kube_client), registry=new_registry(), clock=lambda: T0 + 1)
    await executor.start()
    try:
        # published on the agent's own subject (all its NATS user may publish), naming the victim's node
        spoofed = PodEvictionRequested(
            node="victim-node", at=T0, namespace="jobs", name="big", uid=BIG_UID, feature="BEMemoryEvict", reason="x"
        )
        await bus.publish(subjects.node_eviction(NODE), msgspec.json.encode(spoofed), msg_id="spoofed")

        async def dead_lettered() -> bool:
            return bool(await bus.read_recent(streams.KOORD_DLQ, subjects.DLQ_ALL, since=0, limit=10))

        await eventually(dead_lettered)
        assert kube_api.get("Pod", "big", "jobs") is not None
        # a malformed name never reaches the API server either
        bad = msgspec.json.encode(spoofed).replace(b'"big"', b'"../big"')
        await bus.publish(subjects.node_eviction(NODE), bad, msg_id="malformed")

        async def both() -> bool:
            return len(await bus.read_recent(streams.KOORD_DLQ, subjects.DLQ_ALL, since=0, limit=10)) == 2

        await eventually(both)
    finally:
        await executor.stop()
