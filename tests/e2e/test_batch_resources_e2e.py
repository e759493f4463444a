"""Batch resources end to end through the real processes: `koordbus service k8s` watches a (fake) API server,
`koordbus service noderesource` decides, both talking to a real nats-server.

The cluster holds the spec's §2.6 worked example (a 100-core / 400 GiB node, two prod pods, colocation enabled by
the slo-controller-config ConfigMap) and a current NodeMetric is on the bus, so the decision must be Koordinator's
numbers: batch-cpu 25000, batch-memory 146 GiB, also served by the service's API routes. Turning colocation off
in the ConfigMap must then remove them, and the history must say so.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio

from bus import streams, subjects
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from schemas import quantity
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from tests.fakes.kube_api import FakeKubeApi
from tests.support import api_auth
from tests.unit.test_noderesource_state import GI, NODE, metric_event

pytestmark = pytest.mark.e2e

CONFIGMAP = ("koordinator-system", "slo-controller-config")


def _pod(name: str, cpu: str, memory: str) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": "default", "uid": f"uid-{name}", "labels": {}},
        "spec": {
            "nodeName": NODE,
            "priority": 9500,
            "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu, "memory": memory}}}],
        },
        "status": {"phase": "Running", "qosClass": "Burstable"},
    }


def _configmap(enable: bool) -> dict[str, Any]:
    namespace, name = CONFIGMAP
    return {
        "metadata": {"name": name, "namespace": namespace},
        "data": {"colocation-config": json.dumps({"enable": enable})},
    }


@pytest_asyncio.fixture
async def cluster(kube_api: FakeKubeApi) -> FakeKubeApi:
    kube_api.put(
        "nodes",
        {
            "metadata": {"name": NODE, "labels": {}, "annotations": {}},
            "status": {
                "capacity": {"cpu": "100", "memory": "400Gi"},
                "allocatable": {"cpu": "98", "memory": "392Gi"},
            },
        },
    )
    kube_api.put("pods", _pod("a", "40", "100Gi"))
    kube_api.put("pods", _pod("b", "20", "40Gi"))
    kube_api.put("configmaps", _configmap(enable=True))
    return kube_api


@pytest_asyncio.fixture
async def nats(tmp_path: Path) -> AsyncIterator[tuple[str, JetStreamBus]]:
    server = EmbeddedNatsServer(store_dir=tmp_path / "nats")
    await server.start()
    bus = await JetStreamBus.connect(server.url, name="e2e")
    await bus.ensure_streams(streams.all_streams())
    try:
        yield server.url, bus
    finally:
        await bus.close()
        await server.stop()


@pytest.fixture
def api_port() -> int:
    return free_port()


Spawn = Callable[..., list[subprocess.Popen[str]]]

_OUTPUT_FILES: dict[int, Path] = {}
"""Per spawned process (by pid), the file its stdout and stderr go to (see `spawn`)."""


def output_of(process: subprocess.Popen[str]) -> str:
    """What a process `spawn` started has written so far."""
    return _OUTPUT_FILES[process.pid].read_text(errors="replace")


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Spawn]:
    """Start `koordbus …` processes; whatever is still running at the end gets SIGTERM (then SIGKILL). Each one's
    output goes to a file (a pipe nobody reads would stall a chatty process), and at the end every process's
    command, exit code and output are printed, which pytest shows when the test failed (a service that exited
    early, say because its port was taken, is otherwise only a timeout)."""
    started: list[subprocess.Popen[str]] = []
    run: list[list[str]] = []
    tokens = api_auth.write_token_file(tmp_path / "api-tokens")
    env = {**os.environ, "KOORDBUS_LOG_LEVEL": "INFO", "KOORDBUS_API_TOKENS_FILE": str(tokens)}

    def start(*commands: list[str]) -> list[subprocess.Popen[str]]:
        processes = []
        for command in commands:
            path = tmp_path / f"process-{len(started) + len(processes)}.log"
            with path.open("w") as output:  # the child has its own copy of the file
                process = subprocess.Popen(
                    [sys.executable, "-m", "koordbus.cli", *command],
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    text=True,
                    env=env,
                )
            _OUTPUT_FILES[process.pid] = path
            processes.append(process)
            run.append(command)
        started.extend(processes)
        return processes

    yield start
    for process in started:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
    for process in started:
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for process, command in zip(started, run, strict=True):
        print(f"--- koordbus {' '.join(command)} (exit code {process.returncode}):\n{output_of(process)}")
        del _OUTPUT_FILES[process.pid]


def _noderesource(url: str, database_url: str, port: int) -> list[str]:
    return ["service", "noderesource", "--nats-url", url, "--database-url", database_url, "--port", str(port)]


@pytest.fixture
def services(
    nats: tuple[str, JetStreamBus],
    cluster: FakeKubeApi,
    tmp_path: Path,
    api_port: int,
    spawn: Spawn,
    database_url: str,
) -> list[subprocess.Popen[str]]:
    """The bridge and the noderesource service, on SQLite and on PostgreSQL (database_url is parametrized)."""
    url, _ = nats
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    return spawn(
        ["service", "k8s", "--nats-url", url, "--kubeconfig", str(kubeconfig), "--port", "0"],
        _noderesource(url, database_url, api_port),
    )


def _stopped_cleanly(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        assert process.poll() is None, output_of(process)
        process.send_signal(signal.SIGTERM)
    for process in processes:
        process.wait(timeout=15)
        output = output_of(process)
        assert process.returncode == 0, output
        assert "Traceback" not in output, output


def _with_both_pods(decision: NodeResourceComputed) -> bool:
    """The decision once every input is in: the NodeMetric can reach the service before the bridge's second pod
    does (a decision then counts one pod, 45 cores of batch), and the next decision replaces it."""
    return decision.resources.get("kubernetes.io/batch-cpu") == 25_000


async def _decision(bus: JetStreamBus, *, timeout: float, want: Any) -> NodeResourceComputed:
    """The newest decision for the node once `want(decision)` holds."""
    deadline = time.monotonic() + timeout
    last: NodeResourceComputed | None = None
    while time.monotonic() < deadline:
        delivery = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed(NODE))
        if delivery is not None:
            last = NODERESOURCE_COMPUTED_DECODER.decode(delivery.data)
            if want(last):
                return last
        await asyncio.sleep(0.2)
    raise AssertionError(f"no matching decision within {timeout} s; last: {last}")


def _allocatable(cluster: FakeKubeApi) -> dict[str, str]:
    node = cluster.get("nodes", NODE)
    assert node is not None
    return dict(node["status"]["allocatable"])


async def _eventually(check: Any, *, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := check():
            return result
        await asyncio.sleep(0.2)
    raise AssertionError(f"not reached within {timeout} s")


async def _api(port: int, path: str, *, want: Any, timeout: float = 30) -> Any:
    """GET the route until `want(body)` holds (projection is asynchronous)."""
    deadline = time.monotonic() + timeout
    body: Any = None
    async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", headers=api_auth.headers()) as client:
        while time.monotonic() < deadline:
            try:
                response = await client.get(path)
            except httpx.TransportError:
                response = None
            if response is not None and response.status_code == 200:
                body = response.json()
                if want(body):
                    return body
            await asyncio.sleep(0.2)
    raise AssertionError(f"GET {path} never matched within {timeout} s; last body: {body}")


async def test_node_gets_koordinators_batch_numbers_and_loses_them_when_colocation_is_disabled(
    nats: tuple[str, JetStreamBus], cluster: FakeKubeApi, services: list[subprocess.Popen[str]], api_port: int
) -> None:
    _, bus = nats
    metric = metric_event(at=time.time())
    await bus.publish(
        subjects.nodemetric_computed(NODE), msgspec.json.encode(metric), msg_id=f"e2e-nodemetric-{metric.report_time}"
    )

    decided = await _decision(bus, timeout=60, want=_with_both_pods)
    assert decided.resources["kubernetes.io/batch-cpu"] == 25_000
    assert decided.resources["kubernetes.io/batch-memory"] == 146 * GI
    assert decided.write_due
    current = await _api(
        api_port,
        f"/api/v1/nodes/{NODE}/resources",
        want=lambda b: b["resources"]["kubernetes.io/batch-cpu"]["value"] == 25_000,
    )
    assert current["resources"]["kubernetes.io/batch-memory"]["quantity"] == "146Gi"
    # The bridge writes them on the Node (status subresource) and the NodeMetric object passes the CRD schema.
    await _eventually(lambda: _allocatable(cluster).get("kubernetes.io/batch-cpu") == "25k")
    written = _allocatable(cluster)
    assert written["kubernetes.io/batch-memory"] == "146Gi" and written["cpu"] == "98"
    assert (await _eventually(lambda: cluster.get("nodemetrics", NODE)))["status"]["nodeMetric"]

    # A NodeResourceTopology appears: the bridge publishes it and the decision gains NUMA zones (§2.7).
    cluster.put("noderesourcetopologies", _topology())
    zoned = await _decision(bus, timeout=60, want=lambda d: bool(d.zones))
    assert set(zoned.zones) == {"node-0", "node-1"} and "topology" in zoned.trigger
    assert all(zone["kubernetes.io/batch-cpu"] for zone in zoned.zones.values())

    def zone_entries() -> dict[str, str]:
        nrt = cluster.get("noderesourcetopologies", NODE) or {}
        return {
            zone["name"]: entry["allocatable"]
            for zone in nrt.get("zones", [])
            for entry in zone.get("resources", [])
            if entry["name"] == "kubernetes.io/batch-cpu"
        }

    await _eventually(lambda: len(zone_entries()) == 2)
    assert zone_entries() == {
        zone: quantity.format_amount("kubernetes.io/batch-cpu", values["kubernetes.io/batch-cpu"] or 0)
        for zone, values in zoned.zones.items()
    }

    cluster.put("configmaps", _configmap(enable=False))
    removed = await _decision(bus, timeout=60, want=lambda d: d.resources.get("kubernetes.io/batch-cpu") is None)
    assert removed.outcome == "disabled" and removed.resources["kubernetes.io/batch-memory"] is None
    history = await _api(
        api_port,
        f"/api/v1/nodes/{NODE}/resources/history",
        want=lambda b: b["items"] and b["items"][0]["outcome"] == "disabled",
    )
    await _eventually(lambda: "kubernetes.io/batch-cpu" not in _allocatable(cluster))
    dropped = {c["resource"] for c in history["items"][0]["changes"]}
    assert {"kubernetes.io/batch-cpu", "kubernetes.io/batch-memory"} <= dropped
    config = await _api(api_port, "/api/v1/config/colocation", want=lambda b: b["available"])
    assert config["cluster"]["enable"] is False and not config["error"]

    _stopped_cleanly(services)


def _topology() -> dict[str, Any]:
    """Two NUMA zones splitting the node's 98 allocatable cores and 392Gi."""
    resources = [
        {"name": "cpu", "capacity": "49", "allocatable": "49", "available": "49"},
        {"name": "memory", "capacity": "196Gi", "allocatable": "196Gi", "available": "196Gi"},
    ]
    return {
        "apiVersion": "topology.node.k8s.io/v1alpha1",
        "kind": "NodeResourceTopology",
        "metadata": {"name": NODE},
        "topologyPolicies": ["None"],
        "zones": [{"name": f"node-{i}", "type": "Node", "resources": resources} for i in range(2)],
    }


@pytest.fixture
def bridge_port() -> int:
    return free_port()


async def test_dry_run_decides_and_records_but_writes_nothing(
    nats: tuple[str, JetStreamBus], cluster: FakeKubeApi, tmp_path: Path, bridge_port: int, spawn: Spawn
) -> None:
    """Only the dry-run bridge and noderesource run here, so any write to the API server would be the dry run's."""
    url, bus = nats
    kubeconfig = cluster.kubeconfig(tmp_path / "kubeconfig")
    processes = spawn(
        ["service", "k8s", "--nats-url", url, "--kubeconfig", str(kubeconfig), "--dry-run", "--port", str(bridge_port)],
        _noderesource(url, f"sqlite:///{tmp_path / 'nr.db'}", 0),
    )
    metric = metric_event(at=time.time())
    await bus.publish(
        subjects.nodemetric_computed(NODE), msgspec.json.encode(metric), msg_id=f"e2e-dry-{metric.report_time}"
    )
    await _decision(bus, timeout=60, want=lambda d: d.resources.get("kubernetes.io/batch-cpu") == 25_000)
    recorded = await _api(
        bridge_port,
        "/api/v1/k8s/recorded-writes",
        want=lambda b: any(n["metadata"]["name"] == NODE for n in b["nodes"]) and b["nodemetrics"],
    )
    (node,) = [n for n in recorded["nodes"] if n["metadata"]["name"] == NODE]
    assert node["status"]["allocatable"]["kubernetes.io/batch-cpu"] == "25k"
    assert "kubernetes.io/batch-cpu" not in _allocatable(cluster)  # nothing reached the cluster
    assert cluster.get("nodemetrics", NODE) is None
    assert not [r for r in cluster.requests if r.verb not in ("get", "list", "watch")]
    _stopped_cleanly(processes)
