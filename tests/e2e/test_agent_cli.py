"""`koordbus agent` as a DaemonSet runs it: a real process against a real nats-server, reading its NodeSLO from the
KOORD_SLO bucket and its pods from a kubelet pod list (the fake API's pods of the node), on a generated cgroup tree:
`--apply` writes the BE pod's cgroups and publishes what it did, `--dry-run` publishes the plan and writes nothing,
the node's topology report (with the kubelet's CPU manager state) lands in KOORD_NODE, Ctrl-C stops it cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import httpx
import msgspec
import pytest

from bus import streams, subjects
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from schemas.node import NODE_EVENT_DECODER, NodeMetricsReported
from schemas.node_topology import TOPOLOGY_DECODER
from schemas.qos import ACTUATION_DECODER, ActuationApplied, NodeSloRendered
from tests.e2e.test_qos_e2e import _be_pod
from tests.fakes.kube_api import FakeKubeApi
from tests.integration.test_agent_qos import v1_tree
from tests.support.waiting import eventually
from tests.unit.test_agent_actuate import UID

pytestmark = pytest.mark.e2e

NODE = "node-e2e"  # the node _be_pod is scheduled on


async def _events(bus: JetStreamBus) -> list[ActuationApplied]:
    stored = await bus.read_recent(
        streams.KOORD_NODE, subjects.stored(subjects.node_actuation(NODE)), since=0, limit=100
    )
    return [ACTUATION_DECODER.decode(d.data) for d in stored]


async def _run_agent(
    tmp_path: Path, nats_url: str, kube_api: FakeKubeApi, mode: str, port: int, **extra_env: str
) -> asyncio.subprocess.Process:
    command = [
        sys.executable, "-m", "koordbus.cli", "agent", "--nats-url", nats_url, "--node-name", NODE,
        "--cgroup-root", str(tmp_path / "cg"), mode, "--state-dir", str(tmp_path / "state"),
        "--resctrl-root", str(tmp_path / "no-resctrl"),
        "--kubelet-pods-url", f"{kube_api.url}/api/v1/pods?fieldSelector=spec.nodeName%3D{NODE}",
        "--port", str(port),
    ]  # fmt: skip
    env = {**os.environ, "KOORDBUS_CGROUP_DRIVER": "cgroupfs", "KOORDBUS_CGROUP_VERSION": "1", **extra_env}
    return await asyncio.create_subprocess_exec(
        *command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )


async def _stop(process: asyncio.subprocess.Process) -> str:
    if process.returncode is None:
        process.send_signal(signal.SIGINT)
    output, _ = await asyncio.wait_for(process.communicate(), timeout=30)
    return output.decode()


@pytest.mark.parametrize("mode", ["--apply", "--dry-run"])
async def test_the_agent_command_applies_or_plans_the_be_cgroups(
    tmp_path: Path, koordbus_nats_url: str, koordbus_bus: JetStreamBus, kube_api: FakeKubeApi, mode: str
) -> None:
    files = v1_tree(tmp_path / "cg")
    shares = files[f"cpu/kubepods/besteffort/pod{UID}/cpu.shares"]
    kube_api.put("pods", _be_pod())
    slo = NodeSloRendered(node=NODE, spec={}, rendered_at=1.0)
    await koordbus_bus.publish(subjects.slo_key(NODE), msgspec.json.encode(slo), msg_id="slo")
    kubelet = tmp_path / "kubelet"
    kubelet.mkdir()
    (kubelet / "cpu_manager_state").write_text('{"policyName": "static", "defaultCpuSet": "0", "checksum": 1}')
    port = free_port()
    process = await _run_agent(
        tmp_path, koordbus_nats_url, kube_api, mode, port, KOORDBUS_AGENT_KUBELET_ROOT_DIR=str(kubelet)
    )
    try:

        async def reported() -> bool:
            assert process.returncode is None, "koordbus agent exited early"
            return any(e.loop == "be-cgroup" for e in await _events(koordbus_bus))

        await eventually(reported, timeout=30)
        topology = subjects.stored(subjects.node_topology(NODE))
        await eventually(lambda: koordbus_bus.last_on_subject(streams.KOORD_NODE, topology), timeout=30)
        stored = await koordbus_bus.last_on_subject(streams.KOORD_NODE, topology)
        assert stored is not None
        report = TOPOLOGY_DECODER.decode(stored.data)
        assert report.node == NODE and report.cpus and report.kubelet.policy == "static"
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/readyz")).status_code == 200
            metrics = (await http.get("/metrics")).text
        labels = f'node="{NODE}",part="qos"'
        writes = 6.0 if mode == "--apply" else 0.0
        assert f"koordbus_agent_writes_total{{{labels}}} {writes}" in metrics
        assert f"koordbus_agent_slo_revision{{{labels}}} 1.0" in metrics
        assert f'koordbus_agent_collections_total{{node="{NODE}",part="metrics"}}' in metrics
        assert f'koordbus_agent_reports_sent_total{{node="{NODE}",part="topology"}}' in metrics
    finally:
        output = await _stop(process)
    assert process.returncode == 0, output
    (event,) = [e for e in await _events(koordbus_bus) if e.loop == "be-cgroup"]
    assert event.slo_revision == 1 and len(event.changes) == 6
    if mode == "--apply":
        assert not event.dry_run and shares.read_text().strip() == "2048"
        assert "QoS loops apply" in output
    else:
        assert event.dry_run and shares.read_text().strip() == "1024"
    saved = json.loads((tmp_path / "state" / "nodeslo.json").read_text())
    assert saved == {"revision": 1, "spec": {}}


async def test_the_metrics_half_names_pods_from_the_kubelets_list_with_the_qos_loops_off(
    tmp_path: Path, koordbus_nats_url: str, koordbus_bus: JetStreamBus, kube_api: FakeKubeApi
) -> None:
    """--no-qos: no QoS loop reads the kubelet's list, the metrics half still does and names the pod it measures."""
    v1_tree(tmp_path / "cg")
    pod_dir = tmp_path / "cg" / "{}" / "kubepods" / "besteffort" / f"pod{UID}"
    (Path(str(pod_dir).format("cpuacct")) / "cpuacct.usage").write_text("1000000\n")
    (Path(str(pod_dir).format("memory")) / "memory.stat").write_text("total_active_anon 1048576\n")
    kube_api.put("pods", _be_pod())
    process = await _run_agent(tmp_path, koordbus_nats_url, kube_api, "--no-qos", 0, KOORDBUS_PUBLISH_INTERVAL="2")
    try:

        async def named() -> list[NodeMetricsReported]:
            assert process.returncode is None, "koordbus agent exited early"
            stored = await koordbus_bus.read_recent(
                streams.KOORD_NODE, subjects.stored(subjects.node_metrics(NODE)), since=0, limit=100
            )
            batches = [NODE_EVENT_DECODER.decode(d.data) for d in stored]
            return [b for b in batches if isinstance(b, NodeMetricsReported) and b.pods]

        await eventually(named, timeout=30)
        batch = (await named())[0]
    finally:
        output = await _stop(process)
    assert process.returncode == 0, output
    assert [(p.uid, p.namespace, p.name, p.labels) for p in batch.pods] == [
        (UID, "jobs", "batch-0", {"koordinator.sh/qosClass": "BE"})
    ]
    assert await _events(koordbus_bus) == []  # the QoS loops are off


CONTROL_PLANE_LIBRARIES = ("numpy", "fastapi", "starlette", "pydantic", "sqlalchemy", "uvicorn", "aiohttp", "yarl")


async def test_the_agent_process_loads_none_of_the_control_planes_libraries(
    tmp_path: Path, koordbus_nats_url: str, koordbus_bus: JetStreamBus, kube_api: FakeKubeApi
) -> None:
    """An agent runs on every node: what it imports is paid on every node (bench/agent.py). Python's import profile
    (PYTHONPROFILEIMPORTTIME) lists every module the running agent loaded."""
    v1_tree(tmp_path / "cg")
    kube_api.put("pods", _be_pod())
    port = free_port()
    process = await _run_agent(tmp_path, koordbus_nats_url, kube_api, "--apply", port, PYTHONPROFILEIMPORTTIME="1")
    try:

        async def serving() -> bool:
            assert process.returncode is None, "koordbus agent exited early"
            try:
                async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
                    return (await http.get("/metrics")).status_code == 200
            except httpx.ConnectError:
                return False  # not listening yet

        await eventually(serving, timeout=30)
        await asyncio.sleep(2)  # a few collections and rounds: whatever they import is imported by now
    finally:
        output = await _stop(process)
    imported = {line.rpartition("|")[2].strip() for line in output.splitlines() if line.startswith("import time:")}
    assert "agent.loops.runner" in imported and "nats" in imported  # the profile is there
    # a package counts as loaded when one of its submodules was (a refused `import aiohttp` is profiled too: nats-py
    # tries it, and the agent blocks it, see koordbus.agent._run)
    loaded = {m.split(".")[0] for m in imported if "." in m} | {m for m in imported if m == "yarl"}
    assert sorted(loaded & set(CONTROL_PLANE_LIBRARIES)) == []
