"""agent.simulate: deterministic, realistic synthetic node batches that decode as valid NodeMetricsReported."""

from __future__ import annotations

import time

import pytest

from agent.simulate import GiB, SimulatedNode, simulated_node_names
from schemas import vocab
from schemas.node import NODE_EVENT_DECODER, NodeMetricsReported, encode_node_event
from tests.support import batches as wire

T0 = 1_700_006_400.0  # a day boundary (multiple of 86400), so hours below are UTC hours of day


def day_of_windows(node: SimulatedNode, *, step: float = 900.0) -> list[NodeMetricsReported]:
    return [node.batch(T0 + k * step, T0 + k * step + 10) for k in range(int(86_400 / step))]


def test_names() -> None:
    assert simulated_node_names(3) == ["sim-node-0001", "sim-node-0002", "sim-node-0003"]
    assert simulated_node_names(0) == []
    assert simulated_node_names(10_000)[-1] == "sim-node-10000"


def test_batch_is_deterministic_and_independent_of_call_order() -> None:
    a = SimulatedNode("sim-node-0001", 42, pods=30)
    b = SimulatedNode("sim-node-0001", 42, pods=30)
    later = a.batch(T0 + 3600, T0 + 3610)
    first = a.batch(T0, T0 + 10)
    assert b.batch(T0, T0 + 10) == first
    assert b.batch(T0 + 3600, T0 + 3610) == later
    assert SimulatedNode("sim-node-0001", 43, pods=30).batch(T0, T0 + 10) != first


def test_batch_shape_and_wire_validity() -> None:
    node = SimulatedNode("sim-node-0007", 7, cpu_cores=16, memory_bytes=64 * GiB, pods=20)
    batch = node.batch(T0, T0 + 10)
    decoded = NODE_EVENT_DECODER.decode(encode_node_event(batch))
    assert decoded == batch
    assert (batch.node, batch.window_start, batch.window_end) == ("sim-node-0007", T0, T0 + 10)
    assert [s[0] for s in batch.node_samples] == [T0 + i for i in range(10)]
    assert [p.uid for p in batch.pods] == sorted(p.uid for p in batch.pods)
    for ref, samples in wire.samples_by_pod(batch):
        assert ref.namespace and ref.name and ref.kube_qos and ref.priority is not None
        assert vocab.priority_class_with_default(ref.labels, ref.priority, ref.kube_qos) in (
            vocab.PRIORITY_PROD,
            vocab.PRIORITY_BATCH,
        )
        assert samples and all(T0 <= s[0] < T0 + 10 for s in samples)
        assert [s[0] for s in samples] == sorted(s[0] for s in samples)


def test_node_is_pods_plus_system_and_never_above_capacity() -> None:
    node = SimulatedNode("sim-node-0002", 2, cpu_cores=8, memory_bytes=16 * GiB, pods=60)
    for batch in day_of_windows(node, step=1800):
        for i, (at, cpu, mem) in enumerate(batch.node_samples):
            pods_cpu = sum(s[1] for _, samples in wire.samples_by_pod(batch) for s in samples if s[0] == at)
            pods_mem = sum(s[2] for _, samples in wire.samples_by_pod(batch) for s in samples if s[0] == at)
            _, sys_cpu, sys_mem = batch.system_samples[i]
            assert cpu == pytest.approx(pods_cpu + sys_cpu)
            assert mem == pytest.approx(pods_mem + sys_mem, rel=1e-6)
            assert 0 < cpu <= 8 and 0 < mem <= 16 * GiB
            assert batch.memory_with_page_cache[i][1] >= mem


def test_online_load_follows_a_day_and_batch_pods_come_and_go() -> None:
    node = SimulatedNode("sim-node-0003", 3, pods=100)
    windows = day_of_windows(node)

    def online_cpu(batch: NodeMetricsReported) -> float:
        pods = wire.samples_by_pod(batch)
        return sum(s[1] for ref, samples in pods if ref.kube_qos != vocab.KUBE_QOS_BESTEFFORT for s in samples)

    by_hour = [online_cpu(b) for b in windows]
    afternoon, night = max(by_hour[13 * 4 : 16 * 4]), min(by_hour[1 * 4 : 5 * 4])
    assert afternoon > 1.5 * night
    batch_uids = [{p.uid for p in b.pods if p.kube_qos == vocab.KUBE_QOS_BESTEFFORT} for b in windows]
    counts = [len(u) for u in batch_uids]
    assert min(counts) < max(counts)  # bursts
    assert len(set().union(*batch_uids)) > max(counts)  # new pods (new UIDs) in later bursts
    online_uids = {frozenset(p.uid for p in b.pods if p.kube_qos != vocab.KUBE_QOS_BESTEFFORT) for b in windows}
    assert len(online_uids) == 1  # online pods are long-lived


def test_batch_cost_per_node() -> None:
    nodes = [SimulatedNode(name, seed, pods=100) for seed, name in enumerate(simulated_node_names(50))]
    started = time.perf_counter()
    for k in range(4):
        for node in nodes:
            node.batch(T0 + 10 * k, T0 + 10 * k + 10)
    per_node_ms = (time.perf_counter() - started) / (4 * len(nodes)) * 1000
    print(
        f"SimulatedNode.batch(): {per_node_ms:.3f} ms per node with 100 pods (10,000 nodes ≈ {per_node_ms * 10:.1f} s)"
    )


def test_a_node_keeps_at_most_two_incarnations_of_each_batch_slot() -> None:
    """Batch executors come and go (a new pod, a new UID, every period of their job: 30–120 min); the node keeps
    only the pods it can still be asked for. It kept up to eight incarnations per slot before clearing them all:
    hours of growth at 1,000 nodes, part of `koordbus up`'s rising RSS in the one-hour soak."""
    node = SimulatedNode("sim-node-0003", 3, pods=100)
    first = day_of_windows(node)
    kept = node._batch_pods
    assert kept and all(len(incarnations) <= 2 for incarnations in kept.values())
    assert sum(len(i) for i in kept.values()) < len({p.uid for b in first for p in b.pods})
