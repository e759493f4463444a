"""Node QoS end to end: a change of slo-controller-config in the (fake) Kubernetes API goes through the bridge
(KOORD_CLUSTER), the slo service (the KOORD_SLO key-value bucket on a real nats-server) and the NodeSLO mirror (a
NodeSLO object validated against Koordinator's CRD) to the agent, which lists its pods from the kubelet's pod list
(here the fake API's pods of the node, through agent.pods.KubeletPods) and changes a real cgroup value — on this
machine's cgroup v1 filesystem when it is writable, else on a generated tree (said in the skip-free fallback)."""

from __future__ import annotations

import json
import logging
import os
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from kubernetes_asyncio.client import ApiClient

from agent.loops.runner import QosLoops
from agent.pods import KubeletPods
from agent.settings import AgentSettings, QosSettings
from bus.jetstream import JetStreamBus
from services.common.metrics import new_registry
from services.k8s.nodeslo_mirror import KubeNodeSloSink, NodeSloMirror
from services.k8s.observer import ClusterObserver
from services.k8s.settings import K8sSettings
from services.slo.service import SloService
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_agent_qos import v1_tree
from tests.support.waiting import eventually
from tests.unit.test_agent_actuate import CID, UID

log = logging.getLogger(__name__)

SETTINGS = replace(
    K8sSettings(watch_timeout_seconds=30, backoff_initial_seconds=0.05, backoff_max_seconds=0.5),
    quota_write_interval_seconds=0.05,
)
NODE = "node-e2e"
BATCH = {
    "containers": {
        "main": {
            "requests": {"kubernetes.io/batch-cpu": "2000", "kubernetes.io/batch-memory": "4Gi"},
            "limits": {"kubernetes.io/batch-cpu": "4000", "kubernetes.io/batch-memory": "8Gi"},
        }
    }
}


def _be_pod() -> dict[str, Any]:
    return {
        "metadata": {
            "name": "batch-0",
            "namespace": "jobs",
            "uid": UID,
            "labels": {"koordinator.sh/qosClass": "BE"},
            "annotations": {"node.koordinator.sh/extended-resource-spec": json.dumps(BATCH)},
        },
        "spec": {"nodeName": NODE, "containers": [{"name": "main"}]},
        "status": {
            "phase": "Running",
            "qosClass": "BestEffort",
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{CID}"}],
        },
    }


def _cgroup_root(tmp_path: Path) -> tuple[Path, str, list[Path]]:
    """(root, kubepods parent, directories to remove): the real cgroup v1 filesystem when writable."""
    root = Path("/sys/fs/cgroup")
    pod = f"kubepods/besteffort/pod{UID}/{CID}"
    if not (root / "cgroup.controllers").exists() and all(
        os.access(root / h, os.W_OK) for h in ("cpu", "cpuacct", "memory")
    ):
        parent = f"koordbus-e2e-{uuid.uuid4().hex[:12]}"
        try:
            for hierarchy in ("cpu", "cpuacct", "memory"):
                (root / hierarchy / parent / pod).mkdir(parents=True)
            return root, parent, [root / h / parent for h in ("cpu", "cpuacct", "memory")]
        except OSError as e:
            log.warning("real cgroup v1 refused (%s): using a generated tree", e)
    log.warning("no writable cgroup v1 filesystem here: this end-to-end test writes a generated tree")
    v1_tree(tmp_path / "cg")
    return tmp_path / "cg", "", []


async def test_a_configmap_change_reaches_a_real_cgroup_through_nats_kv(
    tmp_path: Path, koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, kube_client: ApiClient
) -> None:
    bus = koordbus_bus
    kube_api.put("nodes", {"metadata": {"name": NODE}, "status": {"allocatable": {"cpu": "8", "memory": "32Gi"}}})
    kube_api.put("pods", _be_pod())
    kube_api.put(
        "configmaps",
        {"metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"}, "data": {}},
    )
    root, parent, tops = _cgroup_root(tmp_path)
    observer = ClusterObserver(bus, kube_client, SETTINGS, registry=new_registry())
    slo = SloService(bus, registry=new_registry())
    mirror = NodeSloMirror(bus, KubeNodeSloSink(kube_client), settings=SETTINGS, registry=new_registry())
    pods = KubeletPods(f"{kube_api.url}/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}")
    agent = QosLoops(
        AgentSettings(node_name=NODE, cgroup_root=str(root), cgroup_driver="cgroupfs", kubepods_parent=parent),
        QosSettings(qos_mode="apply", state_dir=str(tmp_path / "state"), slo_poll_interval=0.05),
        bus,
        pods=pods,
    )
    quota = root / "cpu" / parent / f"kubepods/besteffort/pod{UID}/cpu.cfs_quota_us"
    try:
        await observer.start()
        await slo.start()
        await mirror.start()

        async def nodeslo_written() -> bool:
            return kube_api.get("NodeSLO", NODE) is not None

        await eventually(nodeslo_written, timeout=15)

        async def quota_is(value: str) -> bool:
            await agent.round()
            return quota.read_text().strip() == value

        await eventually(lambda: quota_is("400000"), timeout=15)  # the BE pod's limit: 4 cores

        # Turn on CPU suppress with the cfsQuota policy: BE pods' own quota is lifted (spec §5.7).
        threshold = {"clusterStrategy": {"enable": True, "cpuSuppressPolicy": "cfsQuota"}}
        kube_api.put(
            "configmaps",
            {
                "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
                "data": {"resource-threshold-config": json.dumps(threshold)},
            },
        )
        await eventually(lambda: quota_is("-1"), timeout=15)
        assert agent.slo.revision >= 2

        async def nodeslo_updated() -> bool:
            obj = kube_api.get("NodeSLO", NODE) or {}
            return obj.get("spec", {}).get("resourceUsedThresholdWithBE", {}).get("cpuSuppressPolicy") == "cfsQuota"

        await eventually(nodeslo_updated, timeout=15)
        nodeslo = kube_api.get("NodeSLO", NODE)
        assert nodeslo is not None and nodeslo["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "koordbus"

        # A bad key: a Warning Event on the ConfigMap; fixed: a Normal one.
        bad = {"clusterStrategy": {"cpuBurstPercent": -5}}
        data = {"resource-threshold-config": json.dumps(threshold), "cpu-burst-config": json.dumps(bad)}
        meta = {"name": "slo-controller-config", "namespace": "koordinator-system"}
        kube_api.put("configmaps", {"metadata": meta, "data": data})

        def events(kind: str) -> list[dict[str, Any]]:
            reasons = ("InvalidSloConfig", "SloConfigApplied")
            return [e for e in kube_api.objects("Event") if e["type"] == kind and e["reason"] in reasons]

        await eventually(lambda: events("Warning"), timeout=15)
        (warning,) = events("Warning")
        assert "cpu-burst-config" in warning["message"] and warning["involvedObject"]["name"] == "slo-controller-config"
        kube_api.put("configmaps", {"metadata": meta, "data": {"resource-threshold-config": json.dumps(threshold)}})
        await eventually(lambda: events("Normal"), timeout=15)

        # The node goes: its NodeSLO is deleted.
        kube_api.remove("nodes", NODE)

        async def nodeslo_deleted() -> bool:
            return kube_api.get("NodeSLO", NODE) is None

        await eventually(nodeslo_deleted, timeout=15)
    finally:
        await pods.close()
        await mirror.stop()
        await slo.stop()
        await observer.stop()
        for top in tops:
            for directory in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)):
                directory.rmdir()
            top.rmdir()
