"""CPU normalization end to end through the real processes (issue 23.4 and 23.5): `koordbus agent --apply` on this
machine's real /sys and /proc reports its CPU model, hyper-threading and turbo; `koordbus service k8s` writes them
on the node's NodeResourceTopology (the fake API server checks it against the CRD) and watches it back;
`koordbus service noderesource` looks the model up in the slo-controller-config's `cpu-normalization-config`, scales
batch-cpu by the ratio and has the bridge write `node.koordinator.sh/cpu-normalization-ratio` on the Node; the agent
reads that ratio with its node's decision and divides its BE pod's CFS quota by it (§5.7). Then normalization is
turned off and everything goes back to the neutral ratio.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agent.topology_watch import read_topology
from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas import koordinator, quantity
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from schemas.qos import NodeSloRendered
from tests.e2e.test_agent_cli import _run_agent, _stop
from tests.e2e.test_batch_resources_e2e import _eventually, _noderesource
from tests.e2e.test_batch_resources_e2e import spawn as spawn  # the fixture
from tests.e2e.test_qos_e2e import _be_pod
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_agent_qos import v1_tree
from tests.unit.test_agent_actuate import UID
from tests.unit.test_noderesource_state import metric_event

pytestmark = pytest.mark.e2e

NODE = "node-e2e"  # the node _be_pod is scheduled on
RATIOS = {
    "baseRatio": 1.25,
    "hyperThreadEnabledRatio": 1.5,
    "turboEnabledRatio": 1.75,
    "hyperThreadTurboEnabledRatio": 2,
}


def _configmap(*, normalization: bool, model: str) -> dict[str, Any]:
    return {
        "metadata": {"name": "slo-controller-config", "namespace": "koordinator-system"},
        "data": {
            "colocation-config": json.dumps({"enable": True}),
            "cpu-normalization-config": json.dumps({"enable": normalization, "ratioModel": {model: RATIOS}}),
        },
    }


def _prod_pod(name: str, cpu: str, memory: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {}},
        "spec": {
            "nodeName": NODE,
            "priority": 9500,
            "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        },
        "status": {"phase": "Running", "qosClass": "Burstable"},
    }


async def _decision(bus: JetStreamBus, *, timeout: float, want: Callable[[NodeResourceComputed], bool]) -> Any:
    """The node's newest batch/mid decision once `want(decision)` holds."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        delivery = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed(NODE))
        if delivery is not None:
            last = NODERESOURCE_COMPUTED_DECODER.decode(delivery.data)
            if want(last):
                return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"no matching decision within {timeout} s; last: {last}")


def _expected_ratio(hyper_threads: bool, turbo: bool) -> float:
    field = {
        (False, False): "baseRatio",
        (True, False): "hyperThreadEnabledRatio",
        (False, True): "turboEnabledRatio",
        (True, True): "hyperThreadTurboEnabledRatio",
    }[(hyper_threads, turbo)]
    return float(RATIOS[field])


async def test_the_nodes_cpu_model_sets_its_ratio_which_scales_batch_cpu_and_the_be_quota(
    tmp_path: Path,
    koordbus_nats_url: str,
    koordbus_bus: JetStreamBus,
    kube_api: FakeKubeApi,
    spawn: Callable[..., list[Any]],
    database_url: str,
) -> None:
    # What this machine's agent will report (the same reader the agent process runs).
    here = read_topology(node=NODE, at=time.time(), sys_root="/sys", proc_root="/proc", kubelet_root_dir="/nowhere")
    model, ratio = here.basic.cpu_model, _expected_ratio(here.basic.hyper_thread_enabled, here.basic.turbo_enabled)
    kube_api.put(
        "nodes",
        {
            "metadata": {"name": NODE, "labels": {}, "annotations": {}},
            "status": {"capacity": {"cpu": "100", "memory": "400Gi"}, "allocatable": {"cpu": "98", "memory": "392Gi"}},
        },
    )
    kube_api.put("pods", _prod_pod("a", "40", "100Gi"))
    kube_api.put("pods", _be_pod())
    kube_api.put("configmaps", _configmap(normalization=True, model=model))
    files = v1_tree(tmp_path / "cg")
    quota = files[f"cpu/kubepods/besteffort/pod{UID}/cpu.cfs_quota_us"]
    slo = NodeSloRendered(node=NODE, spec={}, rendered_at=1.0)
    await koordbus_bus.publish(subjects.slo_key(NODE), msgspec.json.encode(slo), msg_id="slo")
    kubeconfig = kube_api.kubeconfig(tmp_path / "kubeconfig")
    # No process serves a port (0: none): the test reads the bus and the API server. A port picked here for a
    # process to bind later could be taken meanwhile by another test run on the machine, and the process gone.
    services = spawn(
        ["service", "k8s", "--nats-url", koordbus_nats_url, "--kubeconfig", str(kubeconfig), "--port", "0"],
        _noderesource(koordbus_nats_url, database_url, 0),
    )
    agent = await _run_agent(tmp_path, koordbus_nats_url, kube_api, "--apply", 0)
    try:
        metric = metric_event(node=NODE, at=time.time())
        await koordbus_bus.publish(subjects.nodemetric_computed(NODE), msgspec.json.encode(metric), msg_id="metric")

        # the agent's report becomes the node's NodeResourceTopology, with the CPU basic info koordlet writes
        nrt = await _eventually(lambda: kube_api.get("noderesourcetopologies", NODE), timeout=60)
        info = json.loads(nrt["metadata"]["annotations"][koordinator.ANNOTATION_CPU_BASIC_INFO])
        assert info.get("cpuModel", "") == model
        assert len(nrt["zones"]) == len(here.zones)

        # the noderesource service decides the ratio from it, scales batch-cpu and the bridge writes both
        text = f"{ratio:.2f}"
        decided = await _decision(
            koordbus_bus,
            timeout=60,
            want=lambda d: d.annotations.get(koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO) == text,
        )
        unscaled = decided.explanation["kubernetes.io/batch-cpu"].value
        assert unscaled is not None and unscaled > 0
        scaled = decided.resources["kubernetes.io/batch-cpu"]
        assert scaled == -(-int(unscaled * 1000 * ratio) // 1000)  # §2.5: milli-cores × ratio, truncated, rounded up

        def node_annotation() -> str | None:
            node = kube_api.get("nodes", NODE) or {}
            return (node.get("metadata", {}).get("annotations") or {}).get(
                koordinator.ANNOTATION_CPU_NORMALIZATION_RATIO
            )

        await _eventually(lambda: node_annotation() == text, timeout=60)
        written = quantity.format_amount("kubernetes.io/batch-cpu", scaled)

        def batch_allocatable() -> str | None:
            node = kube_api.get("nodes", NODE) or {}
            return (node.get("status", {}).get("allocatable") or {}).get("kubernetes.io/batch-cpu")

        await _eventually(lambda: batch_allocatable() == written, timeout=60)

        # the agent divides the BE pod's 4-core batch limit by the ratio
        want_quota = str(math.ceil(400_000 / ratio))
        await _eventually(lambda: quota.read_text().strip() == want_quota, timeout=60)

        # off again: the neutral ratio, the unscaled batch-cpu and the whole quota
        kube_api.put("configmaps", _configmap(normalization=False, model=model))
        await _eventually(lambda: node_annotation() == "1.00", timeout=60)
        await _eventually(lambda: quota.read_text().strip() == "400000", timeout=60)
    finally:
        output = await _stop(agent)
    assert agent.returncode == 0, output
    assert all(process.poll() is None for process in services), "a service exited early"
