"""One dialect: a simulated node's batch carries no field the real agent leaves empty for the same pods.

The real path here is the agent itself (AgentService: the collector on a generated cgroup tree, the sampler, the pod
identity join with a kubelet-shaped pod list served over HTTP, the batch builder). Its inputs are built from what the
simulated batch says: each pod it reports gets a cgroup (UID, kube QoS, its memory) and a kubelet list entry carrying
everything the simulation claims about it (namespace, name, priority, priorityClassName, every label, its requests,
creation time and whether it is terminating). Whatever the
real agent then leaves empty, field by field and per pod, the simulation must leave empty too.
"""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import msgspec

from agent.pods import KubeletPods
from agent.service import AgentService
from agent.settings import AgentSettings
from agent.simulate import GiB, SimulatedNode
from schemas.node import NODE_EVENT_DECODER, NodeMetricsReported, PodRef
from tests.cgroup_tree import FakeCgroupTree
from tests.integration.test_agent_collect import FlakyPublisher
from tests.integration.test_agent_port import Kubelet
from tests.support import batches as wire

START = 1_750_000_020.0  # a window boundary


def kubelet_item(ref: PodRef, node: str) -> dict[str, object]:
    """The kubelet's entry for a pod, stating all the simulated batch says about it."""
    requests = {"cpu": f"{ref.cpu_request}m", "memory": str(ref.memory_request)}
    spec: dict[str, object] = {"nodeName": node, "containers": [{"name": "main", "resources": {"requests": requests}}]}
    if ref.priority is not None:
        spec["priority"] = ref.priority
    if ref.priority_class_name:
        spec["priorityClassName"] = ref.priority_class_name
    metadata: dict[str, object] = {"uid": ref.uid, "namespace": ref.namespace, "name": ref.name, "labels": ref.labels}
    if ref.created_at is not None:
        metadata["creationTimestamp"] = dt.datetime.fromtimestamp(ref.created_at, dt.UTC).isoformat()
    if ref.terminating:
        metadata["deletionTimestamp"] = dt.datetime.fromtimestamp(START, dt.UTC).isoformat()
    return {"metadata": metadata, "spec": spec, "status": {"phase": "Running", "qosClass": ref.kube_qos}}


def empty(value: object) -> bool:
    return value in (None, "", 0, b"", [], {}, ())


def empty_on_real_filled_on_sim(real: object, sim: object, path: str = "batch") -> list[str]:
    """Paths of the fields `real` leaves empty and `sim` fills (structs field by field, dicts key by key)."""
    if isinstance(real, msgspec.Struct) and isinstance(sim, msgspec.Struct):
        found: list[str] = []
        for name in real.__struct_fields__:
            found += empty_on_real_filled_on_sim(getattr(real, name), getattr(sim, name), f"{path}.{name}")
        return found
    if isinstance(real, dict) and isinstance(sim, dict):
        return [f"{path}[{key!r}]" for key in sim if key not in real]
    return [path] if empty(real) and not empty(sim) else []


async def test_a_simulated_batch_says_nothing_the_real_agent_leaves_empty(tmp_path: Path) -> None:
    sim_node = SimulatedNode("sim-node-0001", 11, cpu_cores=4, memory_bytes=16 * GiB, pods=12)
    sim = sim_node.batch(START, START + 10)
    pods = wire.samples_by_pod(sim)
    assert any(ref.labels for ref, _ in pods)
    tree = FakeCgroupTree(root=tmp_path / "node", version=1, driver="cgroupfs")
    cgroups = [tree.add_pod(ref.uid, ref.kube_qos, active_anon=max(samples[0][2], 1)) for ref, samples in pods]
    tree.write()
    body = json.dumps({"kind": "PodList", "apiVersion": "v1", "items": [kubelet_item(r, sim.node) for r in sim.pods]})
    now = [START]
    publisher = FlakyPublisher()
    async with Kubelet(200, body.encode()) as url:
        settings = AgentSettings(node_name=sim.node, proc_root=str(tree.proc_root), cgroup_root=str(tree.cgroup_root))
        agent = AgentService(settings, publisher, clock=lambda: now[0], pods=KubeletPods(url))
        for _ in range(11):  # [START, START+10) and the tick that closes it
            await agent.collect_once()
            now[0] += 1.0
            for cg in cgroups:
                cg.cpu_ns += 100_000_000
            tree.proc.user += 50
            tree.write()
    real = next(
        b
        for subject, data, _ in publisher.sent
        if subject.endswith("metrics") and isinstance(b := NODE_EVENT_DECODER.decode(data), NodeMetricsReported)
    )
    assert sorted(p.uid for p in real.pods) == sorted(p.uid for p in sim.pods)
    real_pods = {p.uid: p for p in real.pods}
    problems = empty_on_real_filled_on_sim(
        msgspec.structs.replace(real, pods=[]), msgspec.structs.replace(sim, pods=[])
    )
    for ref in sim.pods:
        problems += empty_on_real_filled_on_sim(real_pods[ref.uid], ref, f"pod {ref.namespace}/{ref.name}")
    assert problems == []
    assert [real_pods[ref.uid] for ref in sim.pods] == sim.pods  # the same identity, the same dialect
