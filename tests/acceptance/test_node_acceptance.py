"""Acceptance on this machine's real kernel (issue #20): a kubepods cgroup hierarchy with four pods whose processes burn
known shares of a CPU and hold known memory, a kubelet-shaped /pods, the fake Kubernetes API server holding the Node
(this machine's capacity), the Pods and an slo-controller-config, and the real koordbus processes — the agent with
--apply confined to the test's cgroup parent (and --cpi, reading a static-policy kubelet CPU manager checkpoint from the
test's directory), the nodemetric, noderesource, slo and loadaware services and the k8s bridge with a kubeconfig for the
fake — on a real nats-server.

The tests share one running node (module scope) and run in file order: the NodeMetric and its pod usages first, the
node's NodeResourceTopology from the agent's real /sys and /proc (issue 23.4), node PSI from /proc/pressure in the
agent's batches and the reports (23.6; per-pod PSI, which cgroup v1 lacks, said not available), CPI counted where the
kernel allows perf counters and said unavailable where not (23.6), the batch resources and BE cgroups the NodeMetric
leads to, CPU normalization scaling batch-cpu and dividing the BE pods' CFS quotas (23.5), the extender, then CPU
suppress (judged on the agent's own account of each quota write and the test's own cgroup readings over the agent's
windows, so that the machine's other load does not decide it; skipped, saying so, only when that load leaves the extra
LS process no CPU), the memory eviction that takes a BE pod, memory QoS (23.1: written where the kernel has memory.min,
else one "not supported" problem), and last the agent's account of every file it wrote. The normalization and memory QoS
checks change the slo-controller-config and restore it before they end. Where the kernel does not allow a feature its
check asserts the documented "not supported" behaviour, never a skip. Each failed assertion prints its numbers. Teardown
kills every process and removes every cgroup, and fails when something is left; test_teardown_* checks that on a tree
whose test failed. Spec arithmetic the test recomputes lives in tests/acceptance/spec.py, the suppress test's evidence
in tests/acceptance/suppression.py, what the test reads of the kernel itself in tests/acceptance/kernel.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import logging
import os
import re
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import msgspec
import pytest
import pytest_asyncio

from agent import perf
from bus import streams, subjects
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from schemas.node import NodeMetricComputed
from schemas.noderesource import NODERESOURCE_COMPUTED_DECODER, NodeResourceComputed
from schemas.psi import SIGNALS
from schemas.qos import ACTUATION_DECODER, ActuationApplied
from tests.acceptance import kernel, suppression
from tests.acceptance.kernel import Machine
from tests.acceptance.node import Hierarchy, Kubelet, PodSpec, running_hierarchy, v1_writable, v2_usable
from tests.acceptance.spec import (
    entries,
    go_percent,
    milli,
    spec_batch,
    spec_cfs_quota,
    spec_memory_qos,
    spec_normalized_batch_cpu,
    spec_normalized_quota,
    spec_suppress,
    to_bytes,
)
from tests.acceptance.suppression import Counter, Ticks
from tests.fakes.kube_api import FakeKubeApi
from tests.fakes.kube_rules import CRD_DIR
from tests.faults.processes import KoordbusProcess
from tests.faults.service_process import ServiceProcess
from tests.support.crd import assert_valid_nodemetric, assert_valid_topology
from tests.support.loadaware import pod_json
from tests.support.waiting import eventually

pytestmark = [pytest.mark.acceptance, pytest.mark.cgroup, pytest.mark.timeout(240)]

log = logging.getLogger(__name__)

NODE = "acceptance-node"
CONFIGMAP = ("koordinator-system", "slo-controller-config")
REPORT_INTERVAL = 30  # the nodemetric service's floors: reports at least 30 s apart, windows at least 60 s
WINDOW = 60
MIB = 1 << 20
SUPPRESS_PERCENT = 100  # cpuSuppressThresholdPercent
CPI_INTERVAL, CPI_WINDOW = 10, 2  # seconds: a counting window soon after start where the kernel allows counting

PROD = PodSpec("web", "shop", "Guaranteed")
LS = PodSpec("api", "shop", "Burstable")
BE_A = PodSpec("batch-a", "jobs", "BestEffort")
BE_B = PodSpec("batch-b", "jobs", "BestEffort")
PODS = (PROD, LS, BE_A, BE_B)
LOAD = {PROD.key: (0.25, 64), LS.key: (0.15, 48), BE_A.key: (0.2, 64), BE_B.key: (0.2, 96)}
"""(share of a CPU burned, MiB held) by each pod's process."""
EXPECTED_CLASSES = {  # (priority class, QoS class) the NodeMetric must name
    PROD.key: ("koord-prod", "LS"),
    LS.key: ("koord-prod", "LS"),
    BE_A.key: ("koord-batch", "BE"),
    BE_B.key: ("koord-batch", "BE"),
}
BE_RESOURCES = {  # batch-cpu milli, batch-memory bytes: requests, limits
    "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "256Mi"},
    "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "3Gi"},
}


def _capacity() -> tuple[int, int]:
    """This machine: (CPUs, memory bytes)."""
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    return os.cpu_count() or 1, int(meminfo["MemTotal"].split()[0]) * 1024


def _pod(spec: PodSpec) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace, "uid": spec.uid, "labels": {}}
    container: dict[str, Any] = {"name": "main"}
    pod_spec: dict[str, Any] = {"nodeName": NODE, "containers": [container]}
    if spec is PROD:
        meta["labels"]["koordinator.sh/qosClass"] = "LS"
        pod_spec.update(priority=9500, priorityClassName="koord-prod")
        resources = {"cpu": "500m", "memory": "256Mi"}
        container["resources"] = {"requests": resources, "limits": resources}
    elif spec is LS:
        meta["labels"]["koordinator.sh/qosClass"] = "LS"
        pod_spec.update(priority=9000, priorityClassName="koord-prod")
        container["resources"] = {"requests": {"cpu": "200m", "memory": "128Mi"}, "limits": {"cpu": "1"}}
    else:
        meta["labels"]["koordinator.sh/qosClass"] = "BE"
        meta["annotations"] = {
            "node.koordinator.sh/extended-resource-spec": json.dumps({"containers": {"main": BE_RESOURCES}})
        }
        pod_spec.update(priority=5500, priorityClassName="koord-batch")
        container["resources"] = BE_RESOURCES
    return {
        "metadata": meta,
        "spec": pod_spec,
        "status": {
            "phase": "Running",
            "qosClass": spec.kube_qos,
            "containerStatuses": [{"name": "main", "containerID": f"containerd://{spec.container_id}"}],
        },
    }


def _slo_config(
    *,
    suppress_percent: int,
    memory_evict_percent: int,
    threshold_enable: bool = True,
    cpu_reclaim_percent: int | None = None,
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The slo-controller-config: colocation on (with `cpu_reclaim_percent` as its cpuReclaimThresholdPercent, the
    default 60 when None), CPU suppress (cfsQuota) and memory eviction at these thresholds (`threshold_enable` False
    turns both off), and `extra` keys (name → the JSON value) beside them."""
    namespace, name = CONFIGMAP
    colocation = {
        "enable": True,
        "metricAggregateDurationSeconds": WINDOW,
        "metricReportIntervalSeconds": REPORT_INTERVAL,
        "resourceDiffThreshold": 0.0001,  # every new NodeMetric is written to the Node, so the test can follow it
    }
    if cpu_reclaim_percent is not None:
        colocation["cpuReclaimThresholdPercent"] = cpu_reclaim_percent
    threshold = {
        "clusterStrategy": {
            "enable": threshold_enable,
            "cpuSuppressPolicy": "cfsQuota",
            "cpuSuppressThresholdPercent": suppress_percent,
            "memoryEvictThresholdPercent": memory_evict_percent,
        }
    }
    data = {"colocation-config": json.dumps(colocation), "resource-threshold-config": json.dumps(threshold)}
    data.update({key: json.dumps(value) for key, value in (extra or {}).items()})
    return {"metadata": {"name": name, "namespace": namespace}, "data": data}


@dataclass
class Node:
    """The running node: its cgroups, its cluster, its processes and the test's own CPU samples of each pod."""

    hierarchy: Hierarchy
    kube: FakeKubeApi
    services: dict[str, ServiceProcess]
    agent: KoordbusProcess
    cpus: int
    memory: int
    nats_url: str
    agent_port: int
    machine: Machine
    pinned: frozenset[int]
    """The CPUs the kubelet checkpoint the agent reads gives PROD's container (the static policy)."""
    samples: dict[str, list[tuple[float, int]]] = field(default_factory=dict)
    pressure: list[tuple[float, dict[str, int]]] = field(default_factory=list)
    """The test's own readings of /proc/pressure's totals (kernel.pressure_totals)."""

    def describe(self) -> str:
        parts = [s.describe() for s in self.services.values()]
        return "\n".join([*parts, f"agent log tail:\n{self.agent.tail()}"])

    def measuredmilli(self, pod: PodSpec, start: float, end: float) -> float:
        """The pod's CPU use over [start, end] from the test's own cpuacct.usage samples, in millicores."""
        samples = self.samples[pod.key]
        first = min(samples, key=lambda s: abs(s[0] - start))
        last = min(samples, key=lambda s: abs(s[0] - end))
        return (last[1] - first[1]) / 1e6 / (last[0] - first[0])

    def nodemetric(self) -> dict[str, Any] | None:
        return self.kube.get("NodeMetric", NODE)


async def _sample(node: Node) -> None:
    while True:
        now = time.time()
        for pod in PODS:
            with contextlib.suppress(OSError):
                node.samples.setdefault(pod.key, []).append((now, node.hierarchy.cpu_ns(pod)))
        node.pressure.append((now, kernel.pressure_totals()))
        await asyncio.sleep(0.5)


@pytest_asyncio.fixture(scope="module")
async def node(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[Node]:
    why = v1_writable()
    if why:
        pytest.skip(f"no writable cgroup v1 here ({why}): the acceptance suite needs this machine's real cgroups")
    if not CRD_DIR.is_dir():
        pytest.skip(f"CRD schemas not found at {CRD_DIR}")
    tmp = tmp_path_factory.mktemp("acceptance")
    cpus, memory = _capacity()
    machine = kernel.machine()
    # the kubelet's CPU manager as the agent reads it (its --root-dir): the static policy with PROD's container on
    # the last online CPU (a record only: the suite's cgroups are not pinned by it)
    kubelet_root = tmp / "kubelet"
    kubelet_root.mkdir()
    pinned = frozenset({max(machine.online)})
    (kubelet_root / "cpu_manager_state").write_text(
        kernel.cpu_manager_state(pod_uid=PROD.uid, container="main", pinned=pinned, online=machine.online)
    )
    async with contextlib.AsyncExitStack() as stack:
        hierarchy = stack.enter_context(running_hierarchy())
        for pod in PODS:
            hierarchy.add_pod(pod)
            share, mib = LOAD[pod.key]
            hierarchy.start(pod, share=share, mib=mib)
        server = EmbeddedNatsServer(store_dir=tmp / "nats")
        await server.start()
        stack.push_async_callback(server.stop)
        setup = await JetStreamBus.connect(server.url, name="acceptance-setup")
        await setup.ensure_streams(streams.all_streams())
        await setup.close()
        kube = await stack.enter_async_context(FakeKubeApi())
        resources = {"cpu": str(cpus), "memory": str(memory)}
        kube.put("nodes", {"metadata": {"name": NODE}, "status": {"capacity": resources, "allocatable": resources}})
        for pod in PODS:
            kube.put("pods", _pod(pod))
        kube.put("configmaps", _slo_config(suppress_percent=SUPPRESS_PERCENT, memory_evict_percent=99))
        kubelet = await Kubelet(lambda: [p for p in kube.objects("Pod") if p["spec"].get("nodeName") == NODE]).start()
        stack.push_async_callback(kubelet.stop)
        common = ["--nats-url", server.url]
        database = f"sqlite:///{tmp / 'koordbus.db'}"
        env = {
            "KOORDBUS_REPORT_INTERVAL_SECONDS": str(REPORT_INTERVAL),
            "KOORDBUS_AGGREGATE_DURATION_SECONDS": str(WINDOW),
            "KOORDBUS_REPORT_PHASE_STEP_SECONDS": "0",
            "KOORDBUS_NODEMETRIC_STATUS_INTERVAL_SECONDS": "1",
            "KOORDBUS_BACKOFF_INITIAL_SECONDS": "0.1",
            "KOORDBUS_BACKOFF_MAX_SECONDS": "1",
        }
        args = tmp / "loadaware.yaml"
        args.write_text("usageThresholds: {cpu: 90, memory: 95}\nresourceWeights: {cpu: 1, memory: 1}\n")
        services = {
            "nodemetric": ServiceProcess("nodemetric", *common, "--database-url", database, log_dir=tmp, env=env),
            "noderesource": ServiceProcess("noderesource", *common, "--database-url", database, log_dir=tmp, env=env),
            "slo": ServiceProcess("slo", *common, log_dir=tmp, env=env),
            "loadaware": ServiceProcess("loadaware", *common, "--args-file", str(args), log_dir=tmp, env=env),
            "k8s": ServiceProcess(
                "k8s", *common, "--kubeconfig", str(kube.kubeconfig(tmp / "kubeconfig")), log_dir=tmp, env=env
            ),
        }
        for service in services.values():
            service.start()
            stack.push_async_callback(service.stop)
        agent_port = free_port()
        agent_args = [
            "agent", *common, "--node-name", NODE, "--apply", "--publish-interval", "2",
            "--kubelet-pods-url", kubelet.url, "--state-dir", str(tmp / "state"),
            "--resctrl-root", str(tmp / "no-resctrl"), "--evict", "BEMemoryEvict", "--port", str(agent_port), "--cpi",
        ]  # fmt: skip
        agent = KoordbusProcess(
            agent_args,
            log_path=tmp / "agent.log",
            env={
                "KOORDBUS_KUBEPODS_PARENT": hierarchy.parent,
                "KOORDBUS_CGROUP_VERSION": "1",
                "KOORDBUS_CGROUP_DRIVER": "cgroupfs",
                "KOORDBUS_COLLECT_INTERVAL": "0.5",
                "KOORDBUS_RECONCILE_INTERVAL": "2",
                "KOORDBUS_SLO_POLL_INTERVAL": "0.5",
                "KOORDBUS_PODS_POLL_INTERVAL": "0.5",
                "KOORDBUS_EVICTION_PENDING_SECONDS": "30",
                "KOORDBUS_AGENT_KUBELET_ROOT_DIR": str(kubelet_root),
                "KOORDBUS_AGENT_CPI_INTERVAL": str(CPI_INTERVAL),
                "KOORDBUS_AGENT_CPI_WINDOW": str(CPI_WINDOW),
            },
        )
        agent.start()
        stack.callback(agent.kill)
        running = Node(
            hierarchy=hierarchy,
            kube=kube,
            services=services,
            agent=agent,
            cpus=cpus,
            memory=memory,
            nats_url=server.url,
            agent_port=agent_port,
            machine=machine,
            pinned=pinned,
        )
        sampler = asyncio.create_task(_sample(running))
        stack.callback(sampler.cancel)
        yield running


def test_cgroup_v2_is_covered_only_where_usable() -> None:
    why = v2_usable()
    if why:
        pytest.skip(f"cgroup v2 part NOT run on this machine: {why}")
    pytest.fail("a writable cgroup v2 hierarchy is here but the suite has no v2 run yet")  # pragma: no cover


async def _first_report(node: Node) -> dict[str, Any]:
    def reported() -> bool:
        metric = node.nodemetric()
        for service in node.services.values():
            assert service.running, node.describe()
        node.agent.assert_alive()
        return bool(metric and metric.get("status", {}).get("podsMetric"))

    await eventually(reported, timeout=2 * REPORT_INTERVAL + WINDOW)
    metric = node.nodemetric()
    assert metric is not None
    return metric


def _entry(metric: dict[str, Any], pod: PodSpec) -> dict[str, Any]:
    """`pod`'s podsMetric entry, found by namespace/name."""
    found = entries(metric).get(pod.key)
    assert found is not None, f"no podsMetric entry for {pod.key}: {metric['status']['podsMetric']}"
    return found


async def test_the_nodemetric_names_the_four_pods_with_their_classes(node: Node) -> None:
    metric = await _first_report(node)
    assert_valid_nodemetric(metric)
    by_key = entries(metric)
    names = sorted(by_key)
    assert set(by_key) >= set(EXPECTED_CLASSES), f"podsMetric names {names}, expected {sorted(EXPECTED_CLASSES)}"
    classes = {key: (by_key[key].get("priority"), by_key[key].get("qos")) for key in EXPECTED_CLASSES}
    assert classes == EXPECTED_CLASSES, f"(priority, qos) per pod: {classes}"


async def test_the_agents_topology_is_the_nodes_noderesourcetopology(node: Node) -> None:
    """Issue 23.4 on this machine: the agent reads the real /sys and /proc and the kubelet's CPU manager checkpoint
    (the static policy with PROD's container on the last online CPU, written by the fixture under the agent's
    kubelet root dir), the bridge writes the node's NodeResourceTopology into the fake API server (which checks it
    against the CRD, as this test does again): one zone per NUMA node holding exactly its online CPUs and memory,
    koordlet's annotations naming this machine's CPU model and CPUs, the static policy and PROD's exclusive CPUs,
    which the shared pool leaves out."""
    machine = node.machine
    await eventually(lambda: node.kube.get("NodeResourceTopology", NODE) is not None, timeout=60)
    nrt = node.kube.get("NodeResourceTopology", NODE)
    assert nrt is not None
    assert_valid_topology(nrt)
    now = kernel.numa_memory()
    zones = {zone["name"]: {r["name"]: r for r in zone["resources"]} for zone in nrt["zones"]}
    assert sorted(zones) == sorted(f"node-{n}" for n in machine.numa), (sorted(zones), machine.numa)
    for numa, cpus in machine.numa.items():
        resources = zones[f"node-{numa}"]
        amounts = {field: resources["cpu"][field] for field in ("capacity", "allocatable", "available")}
        assert set(amounts.values()) == {str(len(cpus))}, f"node-{numa}: cpu {amounts}, its cpulist {sorted(cpus)}"
        memory = to_bytes(resources["memory"]["capacity"])
        most = max(machine.numa_memory[numa], now[numa])  # the agent read it between the two readings
        assert 0 < memory <= most, f"node-{numa}: memory {memory}, MemTotal {machine.numa_memory} then, {now} now"
    assert sum(len(cpus) for cpus in machine.numa.values()) == len(machine.online), machine
    annotations = nrt["metadata"]["annotations"]
    basic = json.loads(annotations["node.koordinator.sh/cpu-basic-info"])
    assert basic.get("cpuModel", "") == machine.model, (basic, machine.model)
    assert basic.get("hyperThreadEnabled", False) == machine.hyper_threads, (basic, machine)
    assert basic.get("turboEnabled", False) == machine.turbo, (basic, machine)
    detail = json.loads(annotations["node.koordinator.sh/cpu-topology"])["detail"]
    numa_of = {cpu: numa for numa, cpus in machine.numa.items() for cpu in cpus}
    assert {d["id"]: d["node"] for d in detail} == numa_of, detail
    assert json.loads(annotations["kubelet.koordinator.sh/cpu-manager-policy"]) == {"policy": "static"}, annotations
    allocs = json.loads(annotations["node.koordinator.sh/pod-cpu-allocs"])
    pinned = kernel.cpu_list_text(node.pinned)
    assert allocs == [{"uid": PROD.uid, "cpuset": pinned, "managedByKubelet": True}], allocs
    pools = json.loads(annotations["node.koordinator.sh/cpu-shared-pools"]) or []
    shared = [cpu for pool in pools for cpu in kernel.cpu_list(pool["cpuset"])]
    assert sorted(shared) == sorted(machine.online - node.pinned), f"shared pools {pools}, {PROD.key} on {pinned}"
    log.warning("acceptance topology: %s, model %r, pools %s, allocs %s", sorted(zones), machine.model, pools, allocs)


async def test_each_pods_cpu_in_the_nodemetric_is_what_its_cgroup_used(node: Node) -> None:
    metric = await _first_report(node)
    assert_valid_nodemetric(metric)
    update = dt.datetime.fromisoformat(metric["status"]["updateTime"]).timestamp()
    start = max(update - WINDOW, min(s[0] for s in node.samples[PROD.key]))
    errors = []
    for pod in PODS:
        reported = milli(_entry(metric, pod)["podUsage"]["resources"]["cpu"])
        measured = node.measuredmilli(pod, start, update)
        line = f"{pod.key}: reported {reported}m, measured {measured:.0f}m over [{start:.0f}, {update:.0f}]"
        log.warning("acceptance usage %s", line)
        if abs(reported - measured) > max(0.15 * measured, 50):
            errors.append(line)
    assert not errors, "pod CPU off by more than ±15 % / ±50m:\n" + "\n".join(errors)


async def _report_after(node: Node, at: float) -> NodeMetricComputed:
    """The newest NodeMetric report (NodeMetricComputed) made at or after `at`."""
    found: list[NodeMetricComputed] = []
    bus = await JetStreamBus.connect(node.nats_url, name="acceptance-report-reader")
    subject = subjects.stored(subjects.nodemetric_computed(NODE))

    async def reported() -> bool:
        stored = await bus.last_on_subject(streams.KOORD_NODEMETRIC, subject)
        if stored is None:
            await asyncio.sleep(0.5)
            return False
        found[:] = [msgspec.json.decode(stored.data, type=NodeMetricComputed)]
        if found[0].report_time < at:
            await asyncio.sleep(0.5)
            return False
        return True

    try:
        await eventually(reported, timeout=2 * REPORT_INTERVAL + WINDOW)
    finally:
        await bus.close()
    return found[0]


PSI_TOLERANCE = 0.05
"""How far a report's average stall ratio may lie from the test's own Δtotal/Δwall over the same span: the two read
the counters at different instants, at most 0.5 s apart at each end (the report's window is whole chunks of whole
batches, so it adds no edge of its own): 1/PSI_SPAN only if the stall swung between none and full right at both
edges, far less at a real one; they agreed to within 0.001 in the runs that set it."""
PSI_SPAN = 15.0
"""Seconds of the agent's PSI ratios a compared report's window holds at least."""


async def test_node_psi_from_proc_pressure_reaches_the_batches_and_the_nodemetric_report(node: Node) -> None:
    """Issue 23.6's PSI on this machine: the agent turns /proc/pressure's totals into stall ratios per collection
    (the batches' node_psi) and the nodemetric service averages them over each report's window
    (NodeMetricComputed.psi on koord.v1.nodemetric.computed.<node>, which the dashboard charts; Koordinator's
    NodeMetric has no PSI field, so the object holds none): every signal this kernel has is there and agrees with the
    test's own readings of the same counters; one it lacks is absent, never 0.

    What this kernel lacks: per-pod PSI. The pods' cgroups are cgroup v1 (cpu, cpuacct, memory), which have no
    cpu/memory/io.pressure files on a mainline kernel (PSI per cgroup is a cgroup v2 interface, and this machine's v2
    hierarchy holds no controllers for pods); so the agent says once that pod PSI is not available, its batches carry
    no pod_psi rows and the reports no pods. On a kernel with them the pods' ratios are asserted instead."""
    kernel_signals = set(kernel.pressure_totals())
    pod_dirs = [node.hierarchy.path(c, pod.rel) for pod in PODS for c in ("cpu", "cpuacct")]
    pod_files = kernel.pod_pressure_files(pod_dirs)
    _, batches = await suppression.agent_account(node.nats_url, NODE)
    assert batches, "no batch from the agent"
    first = min((s.t for b in batches for s in b.node_psi), default=node.agent.started_at)
    # a report whose window holds PSI_SPAN of the agent's ratios (reports cover whole 30 s chunks of 2 s batches)
    report = await _report_after(node, first + PSI_SPAN)
    _, batches = await suppression.agent_account(node.nats_url, NODE)
    psi = report.psi
    log_text = node.agent.log_text()
    if not kernel_signals:
        assert not any(b.node_psi for b in batches), "node PSI sent by a kernel without /proc/pressure"
        assert psi is None or psi.node is None, psi
        assert kernel.log_count(log_text, "no node pressure is reported") == 1, node.agent.tail()
    else:
        samples = [s for b in batches for s in b.node_psi]
        assert samples, f"no node PSI in {len(batches)} batches; /proc/pressure has {sorted(kernel_signals)}"
        sent = {signal for s in samples for signal, v in zip(SIGNALS, s.values(), strict=True) if v is not None}
        assert sent == kernel_signals, f"signals sent {sorted(sent)}, /proc/pressure has {sorted(kernel_signals)}"
        assert psi is not None and psi.node is not None, f"no node PSI in the report at {report.report_time}"
        # the agent's first ratio covers the interval before its first sample's time (its first reading gives none)
        start = max(report.report_time - WINDOW, min(s.t for s in samples) - 0.5)
        end = report.report_time
        lines, wrong = [], []
        for signal in SIGNALS:
            average = getattr(psi.node, signal)
            if signal not in kernel_signals:
                if average is not None:
                    wrong.append(f"{signal}: {average} in the report, absent from /proc/pressure")
                continue
            measured = kernel.stall_ratio(node.pressure, signal, start, end)
            line = f"{signal}: report {average}, /proc/pressure {measured:.4f} over [{start:.0f}, {end:.0f}]"
            lines.append(line)
            if average is None or abs(average - measured) > PSI_TOLERANCE:
                wrong.append(line)
        assert not wrong, "node PSI off by more than ±0.05:\n" + "\n".join(wrong + lines)
        log.warning("acceptance psi: %s", "; ".join(lines))
    if pod_files:
        reported = {(p.namespace, p.name) for p in (psi.pods if psi else [])}
        assert {(pod.namespace, pod.name) for pod in PODS} <= reported, (pod_files[:3], reported)
    else:
        rows = sum(len(b.pod_psi) for b in batches)
        assert rows == 0, f"{rows} pod PSI rows from cgroups without pressure files"
        assert psi is None or psi.pods == [], psi
        said = kernel.log_count(log_text, "no pod pressure is reported")
        assert said == 1, f"the agent said {said} times that pod PSI is not available:\n{node.agent.tail()}"


async def test_cpi_is_counted_where_the_kernel_allows_it_and_said_unavailable_where_not(node: Node) -> None:
    """Issue 23.6's CPI, the suite's agent started with --cpi: where perf_event_open counts hardware events here and
    the pods' cgroups are in a perf_event hierarchy, each pod's batches carry cycles and instructions above 0; where
    the kernel refuses (this machine: no hardware PMU, perf_event_open of a hardware event fails with ENOENT), the
    agent's /metrics says koordbus_agent_cpi_unavailable 1, its log names the reason once, and no batch carries
    pod_cpi — no zeros. The CPI rounds count nothing else, so the other checks run as without --cpi."""
    why = perf.probe()  # the one perf_event_open the agent makes, from this process, root like the agent
    unavailable_metric = "koordbus_agent_cpi_unavailable/metrics"
    metrics: dict[str, float] = {}

    async def scraped() -> bool:
        node.agent.assert_alive()
        metrics.update(await kernel.agent_metrics(node.agent_port, NODE))
        await asyncio.sleep(0.2 if unavailable_metric not in metrics else 0)
        return unavailable_metric in metrics

    await eventually(scraped, timeout=30)
    if why is None and "perf_event" in node.hierarchy.controllers:

        async def counted() -> bool:
            await asyncio.sleep(1)
            _, batches = await suppression.agent_account(node.nats_url, NODE)
            uids = {uid for uid, row in kernel.cpi_rows(batches) if row.cycles > 0 and row.instructions > 0}
            return uids >= {pod.uid for pod in PODS if node.kube.get("pods", pod.name, pod.namespace)}

        await eventually(counted, timeout=3 * CPI_INTERVAL)
        metrics.update(await kernel.agent_metrics(node.agent_port, NODE))
        assert metrics[unavailable_metric] == 0, metrics
        log.warning("acceptance cpi: counted, %s", {k: v for k, v in metrics.items() if "cpi" in k})
        return
    if why is None:  # the kernel counts, but the suite's pods are in no perf_event hierarchy
        said = "CPI not counted for any pod: no"
        await asyncio.sleep(CPI_INTERVAL + CPI_WINDOW)  # a round that found no pod to count
        metrics.update(await kernel.agent_metrics(node.agent_port, NODE))
    else:
        said = f"CPI not available: {why}"
    _, batches = await suppression.agent_account(node.nats_url, NODE)
    rows = kernel.cpi_rows(batches)
    assert metrics[unavailable_metric] == 1, {k: v for k, v in metrics.items() if "cpi" in k}
    assert metrics.get("koordbus_agent_cpi_rounds_total/metrics") == 0, metrics
    assert not rows, f"CPI rows although the kernel refuses: {rows[:3]}"
    assert kernel.log_count(node.agent.log_text(), said) == 1, f"the agent's log should say {said!r} once"
    log.warning("acceptance cpi: unavailable here (%s); %s batches, no pod_cpi", why, len(batches))


async def test_the_nodes_batch_resources_are_spec_2_4_of_the_nodemetric_and_pods(node: Node) -> None:
    await _first_report(node)
    seen: list[str] = []

    def matches() -> bool:
        node_obj, metric = node.kube.get("Node", NODE), node.nodemetric()
        assert node_obj is not None and metric is not None
        pods = [p for p in node.kube.objects("Pod") if p["spec"].get("nodeName") == NODE]
        cpu, memory, formula = spec_batch(node_obj, metric, pods)
        allocatable = node_obj["status"]["allocatable"]
        written = (allocatable.get("kubernetes.io/batch-cpu"), allocatable.get("kubernetes.io/batch-memory"))
        seen.append(f"node {written} vs spec: {formula} (NodeMetric {metric['status']['updateTime']})")
        return written == (str(cpu), str(memory)) and node_obj["status"]["capacity"].get(
            "kubernetes.io/batch-cpu"
        ) == str(cpu)

    try:
        await eventually(matches, timeout=2 * REPORT_INTERVAL)
    except AssertionError:
        raise AssertionError("batch resources differ from spec §2.4:\n" + "\n".join(seen[-3:])) from None
    log.warning("acceptance batch %s", seen[-1])


def _spec_5_7() -> dict[str, str]:
    """Spec §5.7 for one BE pod of BE_RESOURCES under the cfsQuota suppress policy (quota lifted: -1)."""
    requests, limits = BE_RESOURCES["requests"], BE_RESOURCES["limits"]
    shares = min(max(int(requests["kubernetes.io/batch-cpu"]) * 1024 // 1000, 2), 262144)
    return {
        "cpu/cpu.shares": str(shares),
        "cpu/cpu.cfs_quota_us": "-1",
        "memory/memory.limit_in_bytes": str(to_bytes(limits["kubernetes.io/batch-memory"])),
    }


def _spec_5_7_wrong(node: Node, pods: tuple[PodSpec, ...] | list[PodSpec]) -> list[str]:
    """Each file of the BE pods' and their containers' cgroups that does not hold _spec_5_7's value."""
    wrong = []
    for pod in pods:
        for rel in (pod.rel, f"{pod.rel}/{pod.container_id}"):  # the pod and its container
            for key, value in _spec_5_7().items():
                controller, name = key.split("/")
                found = node.hierarchy.read(controller, rel, name)
                if found != value:
                    wrong.append(f"{controller}/{rel}/{name} = {found}, spec §5.7: {value}")
    return wrong


async def test_the_be_pods_cgroups_hold_spec_5_7_values(node: Node) -> None:
    try:
        await eventually(lambda: not _spec_5_7_wrong(node, (BE_A, BE_B)), timeout=30)
    except AssertionError:
        wrong = _spec_5_7_wrong(node, (BE_A, BE_B))
        raise AssertionError("BE cgroups:\n" + "\n".join(wrong) + f"\n{node.agent.tail()}") from None


def _restored_config() -> dict[str, Any]:
    """The module's slo-controller-config as the fixture wrote it: CPU suppress at SUPPRESS_PERCENT, memory eviction
    at 99 % (none unless a test lowers it, as the eviction test does)."""
    return _slo_config(suppress_percent=SUPPRESS_PERCENT, memory_evict_percent=99)


NORMALIZATION_RATIOS = {
    "baseRatio": 1.25,
    "hyperThreadEnabledRatio": 1.5,
    "turboEnabledRatio": 1.75,
    "hyperThreadTurboEnabledRatio": 2.0,
}
"""Ratios exact in binary (so the test's float arithmetic is exact), a different one for each CPU state."""


def _normalization_config(node: Node, *, enable: bool) -> dict[str, Any]:
    """The module's config with CPU suppress and eviction off (§5.7: under the cfsQuota suppress policy the BE pods'
    own quota is -1, so only without it do they show a quota to divide), no CPU safety margin (a 2-CPU machine's
    other load would otherwise leave batch-cpu at 0, which no ratio scales) and cpu-normalization-config naming this
    machine's CPU model."""
    normalization = {"enable": enable, "ratioModel": {node.machine.model: NORMALIZATION_RATIOS}}
    return _slo_config(
        suppress_percent=SUPPRESS_PERCENT,
        memory_evict_percent=99,
        threshold_enable=False,
        cpu_reclaim_percent=100,
        extra={"cpu-normalization-config": normalization},
    )


async def _decision(bus: JetStreamBus) -> NodeResourceComputed | None:
    """The node's newest batch/mid decision of the noderesource service."""
    stored = await bus.last_on_subject(streams.KOORD_NODERESOURCE, subjects.noderesource_computed(NODE))
    return None if stored is None else NODERESOURCE_COMPUTED_DECODER.decode(stored.data)


BATCH_CPU = "kubernetes.io/batch-cpu"
RATIO_ANNOTATION = "node.koordinator.sh/cpu-normalization-ratio"


async def _normalized(node: Node, ratio_text: str, *, quota: int) -> None:
    """Waits until the Node carries `ratio_text`, its batch-cpu is the newest decision's explanation scaled by it
    (§2.5; an explanation above 0 where the ratio scales, so that the scaling shows) and every BE pod still on the
    node, and its container, has CFS quota `quota` (§5.7)."""
    ratio = float(ratio_text)
    seen: list[str] = []

    async def node_scaled() -> bool:
        await asyncio.sleep(0.2)
        node_obj, decision = node.kube.get("Node", NODE) or {}, await _decision(bus)
        annotation = (node_obj.get("metadata", {}).get("annotations") or {}).get(RATIO_ANNOTATION)
        written = (node_obj.get("status", {}).get("allocatable") or {}).get(BATCH_CPU)
        capacity = (node_obj.get("status", {}).get("capacity") or {}).get(BATCH_CPU)
        if decision is None or (item := decision.explanation.get(BATCH_CPU)) is None or item.value is None:
            seen.append(f"annotation {annotation}, batch-cpu {written}, no decision with a batch-cpu explanation")
            return False
        scaled = spec_normalized_batch_cpu(item.value, ratio)
        seen.append(
            f"annotation {annotation}, batch-cpu {written} (capacity {capacity}); decision {decision.computed_at:.0f}: "
            f"ratio {decision.annotations.get(RATIO_ANNOTATION)}, explanation {item.value} → §2.5 {scaled}, "
            f"resources {decision.resources.get(BATCH_CPU)}, steps {decision.prepare_steps.get(BATCH_CPU)}"
        )
        return (
            annotation == ratio_text
            and (item.value > 0 or ratio == 1.0)
            and decision.annotations.get(RATIO_ANNOTATION) == ratio_text
            and decision.resources.get(BATCH_CPU) == scaled
            and written == capacity == str(scaled)
        )

    bus = await JetStreamBus.connect(node.nats_url, name="acceptance-decision-reader")
    try:
        await eventually(node_scaled, timeout=2 * REPORT_INTERVAL + 10)  # a new report if batch-cpu was 0
    except AssertionError:
        raise AssertionError(f"ratio {ratio_text} not on the Node:\n" + "\n".join(seen[-3:])) from None
    finally:
        await bus.close()
    be_pods = [p for p in (BE_A, BE_B) if node.kube.get("pods", p.name, p.namespace) is not None]
    assert be_pods, "no BE pod left on the node"
    wrong: list[str] = []

    def quotas() -> bool:
        wrong.clear()
        for pod in be_pods:
            for rel in (pod.rel, f"{pod.rel}/{pod.container_id}"):
                found = node.hierarchy.read("cpu", rel, "cpu.cfs_quota_us")
                if found != str(quota):
                    wrong.append(f"cpu/{rel}/cpu.cfs_quota_us = {found}, spec §5.7 at ratio {ratio_text}: {quota}")
        return not wrong

    try:
        await eventually(quotas, timeout=30)
    except AssertionError:
        raise AssertionError("BE quotas:\n" + "\n".join(wrong) + f"\n{node.agent.tail()}") from None
    log.warning("acceptance normalization %s: %s; BE quota %s", ratio_text, seen[-1], quota)


async def test_cpu_normalization_scales_batch_cpu_and_divides_the_be_pods_quotas(node: Node) -> None:
    """Issue 23.5 on this machine: cpu-normalization-config on, with a ratioModel for this machine's CPU model (the
    one the agent put on the NodeResourceTopology), sets the Node's cpu-normalization-ratio annotation (the ratio of
    this machine's hyper-threading/turbo state), scales the Node's batch-cpu (the noderesource decision's
    explanation × ratio, spec §2.5), and the agent divides the BE pods' real cpu.cfs_quota_us by it (§5.7:
    ceil(quota / ratio)). CPU suppress and eviction are off meanwhile (under the cfsQuota policy a BE pod's own quota
    is -1). Turned off again the ratio is 1.00, batch-cpu unscaled and the quota whole; the module's config is then
    restored, and the test ends once the BE pods' cgroups hold §5.7's values under suppress again (quota -1), as the
    suppress test after it needs. It runs here, before the eviction takes the BE pods."""
    machine = node.machine
    field = {
        (False, False): "baseRatio",
        (True, False): "hyperThreadEnabledRatio",
        (False, True): "turboEnabledRatio",
        (True, True): "hyperThreadTurboEnabledRatio",
    }[(machine.hyper_threads, machine.turbo)]
    ratio = NORMALIZATION_RATIOS[field]
    whole = int(BE_RESOURCES["limits"][BATCH_CPU]) * 100  # MilliCPUToQuota of the batch-cpu limit (milli), µs
    try:
        node.kube.put("configmaps", _normalization_config(node, enable=True))
        await _normalized(node, f"{ratio:.2f}", quota=spec_normalized_quota(whole, ratio))
        node.kube.put("configmaps", _normalization_config(node, enable=False))
        await _normalized(node, "1.00", quota=whole)
    finally:
        node.kube.put("configmaps", _restored_config())
    be_pods = [p for p in (BE_A, BE_B) if node.kube.get("pods", p.name, p.namespace) is not None]
    try:
        await eventually(lambda: not _spec_5_7_wrong(node, be_pods), timeout=30)
    except AssertionError:
        raise AssertionError("BE cgroups not restored:\n" + "\n".join(_spec_5_7_wrong(node, be_pods))) from None


_SCORE_TOTALS = re.compile(r"(cpu|memory) (\d+)/(\d+)")
_DETAIL = re.compile(r"(cpu|memory) (\d+)% = \((.+?) (\d+) \+ assigned (\d+) \+ pod (\d+)\) / (\d+)")


async def test_the_load_aware_extender_filters_and_scores_by_the_measured_usage(node: Node) -> None:
    await _first_report(node)
    new_pod = pod_json("new", namespace="shop", cpu="200m", memory="256Mi", limit_cpu="200m", limit_memory="256Mi")
    service = node.services["loadaware"]
    async with httpx.AsyncClient(base_url=service.base_url, timeout=10) as client:

        async def explained() -> dict[str, Any]:
            response = await client.post("/explain", json={"pod": new_pod, "node": NODE})
            assert response.status_code == 200, f"{response.status_code} {response.text}\n{service.describe()}"
            return dict(response.json())

        async def has_metric() -> bool:
            return (await explained())["nodemetric_update_time"] is not None

        await eventually(has_metric, timeout=2 * REPORT_INTERVAL)
        body = {"Pod": new_pod, "NodeNames": [NODE]}
        # one NodeMetric round: explain, filter and prioritize must all answer from the same report
        for _ in range(3):
            explain = await explained()
            filtered = (await client.post("/filter", json=body)).json()
            prioritized = (await client.post("/prioritize", json=body)).json()
            if (await explained())["nodemetric_update_time"] == explain["nodemetric_update_time"]:
                break
    metric = node.nodemetric()
    assert metric is not None
    report_time = dt.datetime.fromisoformat(metric["status"]["updateTime"]).timestamp()
    assert abs(report_time - float(explain["nodemetric_update_time"])) < 1, (explain, metric["status"]["updateTime"])
    usage = metric["status"]["nodeMetric"]["nodeUsage"]["resources"]
    measured = {"cpu": milli(usage["cpu"]), "memory": to_bytes(usage["memory"])}
    allocatable = {"cpu": node.cpus * 1000, "memory": node.memory}
    thresholds = {"cpu": 90, "memory": 95}
    lines = _DETAIL.findall(explain["filter"]["detail"])
    assert lines, f"no arithmetic in the extender's answer: {explain}"
    totals: dict[str, int] = {}
    for name, percent, _, base, assigned, pod, total in lines:
        assert int(base) == measured[name], f"{name}: the extender's base {base} is not the NodeMetric's {measured}"
        assert int(total) == allocatable[name], f"{name}: allocatable {total}, node {allocatable[name]}"
        totals[name] = int(base) + int(assigned) + int(pod)
        assert int(percent) == go_percent(totals[name], allocatable[name]), (name, percent, totals, allocatable)
    passes = all(go_percent(totals[n], allocatable[n]) <= thresholds[n] for n in totals)
    assert filtered["NodeNames"] == ([NODE] if passes else []), f"filter {filtered} for totals {totals}: {explain}"
    # spec §6.6 (weights cpu 1, memory 1) from the estimated totals the score names: the cpu one is the filter's
    estimated = {name: int(used) for name, used, _ in _SCORE_TOTALS.findall(explain["score"]["detail"])}
    assert estimated.get("cpu") == totals["cpu"] and "memory" in estimated, (explain["score"], totals)
    shares = [
        (allocatable[n] - used) * 100 // allocatable[n] if used <= allocatable[n] else 0
        for n, used in estimated.items()
    ]
    assert explain["score"]["score"] == sum(shares) // 2, f"score {explain['score']}, §6.6 shares {shares}"
    (entry,) = prioritized
    assert entry == {"Host": NODE, "Score": explain["score"]["extender_score"]}, (prioritized, explain["score"])
    log.warning("acceptance extender: measured %s, totals %s, filter %s, score %s", measured, totals, filtered, entry)


BESTEFFORT_QUOTA = "kubepods/besteffort/cpu.cfs_quota_us"
USAGE_MAX_AGE = 3.0  # the agent's QosSettings.usage_max_age: CPU suppress acts on a collection at most this old
BURNER = 0.9  # share of a CPU the extra LS load asks for
MEANINGFUL_MILLI = 50  # below this the extra load hardly moves the non-BE term: the test then proves nothing


async def test_raising_the_ls_load_narrows_the_besteffort_quota_and_lowering_it_restores_it(node: Node) -> None:
    """Judged on the agent's own account, so the machine's other load cannot decide it (see suppression.py): every
    quota write is spec §5.5.1 of the terms it states; the non-BE term is what the LS and prod pods used over the
    very window the agent measured, extra LS load included while it runs and gone once it stops; and while it runs
    the quota is narrower than the same round would give without it. The test provokes writes by setting the
    quota to -1 itself ("probes"): the agent writes it again at its next round, stating its terms. A write's
    collection is found by its terms among those the round may have used (`Ticks.stated_by`: the round takes its time
    before it reads the kubelet's pod list and the latest collection after, so that may be a few ms newer).

    The tolerance on the non-BE term is what the test cannot pin down, no more: it reads the prod pod's, the LS
    container's and the extra load's cgroups every 10 ms, the agent reads its counters within READ_DELAY (50 ms)
    of a collection's timestamp, so each counter's change over the agent's window lies between the test's reads
    that surround those instants (`Counter.bracket`), and the agent truncates each pod to whole millicores (≤ 1m a
    pod). Over the agent's 0.5 s windows that bracket was 34–728m wide, median 102m, nine in ten under 210m (145
    windows of 25 runs on this 2-core machine, busy with other tests, five of them beside two or three CPU hogs): it
    widens with the gaps between the test's own reads when the test process gets little CPU, never with the other
    load as such, which the agent's window accounts for like the test's."""
    quota_file = node.hierarchy.path("cpu", BESTEFFORT_QUOTA)

    def quota() -> int:
        return int(quota_file.read_text())

    try:
        await eventually(lambda: quota() > 0, timeout=60)  # the cfsQuota policy has written a quota (-1: unlimited)
    except AssertionError:
        raise AssertionError(f"CPU suppress never wrote a quota (still {quota()})\n{node.describe()}") from None
    burner_id = uuid.uuid4().hex + uuid.uuid4().hex
    node.hierarchy.add_container(LS, burner_id)
    cpuacct = node.hierarchy.path("cpuacct")
    prod = Counter(cpuacct / PROD.rel / "cpuacct.usage")
    ls_main = Counter(cpuacct / LS.rel / LS.container_id / "cpuacct.usage")
    burner = Counter(cpuacct / LS.rel / burner_id / "cpuacct.usage")
    sampled_from = time.time()
    sampler = asyncio.create_task(suppression.sample((prod, ls_main, burner), period=0.01))
    probes: list[float] = []

    async def probe() -> None:
        probes.append(time.time())
        quota_file.write_text("-1")
        await eventually(lambda: quota() != -1, timeout=10)

    try:
        await asyncio.sleep(1)  # test reads before the first window; not a wait for a condition
        await probe()
        started = time.time()
        extra = node.hierarchy.start(LS, share=BURNER, mib=8, container_id=burner_id)
        try:
            await asyncio.sleep(1.5)  # whole collection windows with the extra load in them
            for _ in range(3):
                await probe()
        finally:
            stopped = time.time()
            extra.stop()
        await asyncio.sleep(1)  # a whole collection window after it
        await probe()
        await probe()
        ended = time.time()
        await asyncio.sleep(0.2)  # the test's reads after the last window: brackets need one on each side
    finally:
        sampler.cancel()
        sampled_until = time.time()
    burned = burner.used_milli(started, stopped)
    if burned < MEANINGFUL_MILLI:
        pytest.skip(
            f"CPU suppress NOT CHECKED: the extra LS load asked for {BURNER * 1000:.0f}m but got only {burned:.0f}m "
            f"over {stopped - started:.1f} s: this machine's other load starves the test's cgroups"
        )

    events, batches = await suppression.agent_account(node.nats_url, NODE)
    writes = suppression.quota_writes(events, path_suffix=f"{node.hierarchy.parent}/{BESTEFFORT_QUOTA}")
    covered = ended + suppression.LIST_DELAY  # the newest collection a write up to `ended` may have used
    if Ticks(batches).last < covered:  # the batch holding the last collection is published at its window's end

        async def published() -> bool:
            nonlocal events, batches
            await asyncio.sleep(0.5)
            events, batches = await suppression.agent_account(node.nats_url, NODE)
            return Ticks(batches).last >= covered

        await eventually(published, timeout=15)
        writes = suppression.quota_writes(events, path_suffix=f"{node.hierarchy.parent}/{BESTEFFORT_QUOTA}")
    ticks = Ticks(batches)
    report = "\n".join(w.line() for w in writes[-20:])

    # (2) every quota written is spec §5.5.1 of the terms it states, and the file held what the last one wrote
    problems = suppression.spec_problems(writes, cpus=node.cpus, threshold_percent=SUPPRESS_PERCENT, probes=probes)
    suppress_writes = [w for w in writes if w.capacity is not None]
    assert suppress_writes and not problems, "quota writes:\n" + "\n".join(problems or ["none"]) + f"\n{report}"

    # (1) the non-BE term is what the non-BE pods used over the agent's own window, the extra load included while
    # it runs and gone after; (3) while it runs, the quota is narrower than the same round would give without it
    during: list[str] = []
    after: list[str] = []
    narrowed: list[str] = []
    wrong: list[str] = []
    for write in suppress_writes:
        if not probes[0] <= write.at <= ended:
            continue
        tick = ticks.stated_by(write, be_uids={BE_A.uid, BE_B.uid}, max_age=USAGE_MAX_AGE)
        if tick is None:
            near = ticks.near(write.at, be_uids={BE_A.uid, BE_B.uid}, max_age=USAGE_MAX_AGE)
            wrong.append(f"no collection of the agent has the terms of {write.line()}; (time, non-BE, system, pods) "
                         f"of its collections then: {near}")  # fmt: skip
            continue
        if tick.previous < sampled_from or tick.at + suppression.READ_DELAY > sampled_until:
            continue  # measured before or after the test read the cgroups
        measured = suppression.measure(write, tick, own=(prod, ls_main), extra=burner)
        if measured is None:
            wrong.append(f"the test did not read the cgroups around [{tick.previous:.2f}, {tick.at:.2f}]")
            continue
        if not measured.agrees:
            wrong.append(measured.line())
        if tick.previous >= started and tick.at <= stopped:
            during.append(measured.line())
            extra_low = int(measured.extra[0])  # the least the extra load can have used in that window
            if write.before == -1 and extra_low > 0:
                alone = spec_suppress(
                    capacity_milli=node.cpus * 1000,
                    threshold_percent=SUPPRESS_PERCENT,
                    min_percent=None,
                    non_be=write.non_be - extra_low,
                    system=write.system,
                )
                without = spec_cfs_quota(alone, current=-1, cpus=node.cpus)
                narrowed.append(f"quota {write.after} µs, without the extra load {without} µs")
                if without is None or not write.after < without:
                    wrong.append(f"not narrowed by the extra load: without it {without}: {measured.line()}")
        elif tick.previous >= stopped:
            after.append(measured.line())
    summary = "\nduring:\n" + "\n".join(during) + "\nafter:\n" + "\n".join(after) + f"\nwrites:\n{report}"
    assert not wrong, "the non-BE term is not what the pods used (bracketed):\n" + "\n".join(wrong) + summary
    assert narrowed and after, f"no write to judge during and after the extra load (narrowed {narrowed}): {summary}"
    log.warning("acceptance suppress: extra load got %.0fm; %s%s", burned, "; ".join(narrowed), summary)


def _memory_used_percent() -> int:
    meminfo = {
        k: int(v.split()[0]) for k, v in (line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    }
    return (meminfo["MemTotal"] - meminfo["MemAvailable"]) * 100 // meminfo["MemTotal"]


async def test_a_growing_be_process_gets_its_be_pod_evicted_and_never_an_ls_pod(node: Node) -> None:
    used = _memory_used_percent()
    threshold = used + 4
    node.kube.put("configmaps", _slo_config(suppress_percent=SUPPRESS_PERCENT, memory_evict_percent=threshold))

    def configured() -> bool:
        slo = node.kube.get("NodeSLO", NODE) or {}
        return (
            slo.get("spec", {}).get("resourceUsedThresholdWithBE", {}).get("memoryEvictThresholdPercent") == threshold
        )

    await eventually(configured, timeout=30)
    assert not [r for r in node.kube.requests if r.verb == "evict"], "evicted before any BE process grew"
    grow_mib = (threshold - used + 3) * node.memory // 100 // MIB
    grown = node.hierarchy.start(BE_B, share=0.0, mib=grow_mib)

    def evicted() -> bool:
        return node.kube.get("pods", BE_B.name, BE_B.namespace) is None

    try:
        await eventually(evicted, timeout=30)
    except AssertionError:
        raise AssertionError(
            f"{BE_B.key} not evicted: node memory {_memory_used_percent()} %, threshold {threshold} % "
            f"(grew by {grow_mib} MiB)\n{node.describe()}"
        ) from None
    finally:
        grown.stop()  # the kubelet's part: the evicted pod's processes end
    evictions = [r.path for r in node.kube.requests if r.verb == "evict"]
    assert f"/api/v1/namespaces/{BE_B.namespace}/pods/{BE_B.name}/eviction" in evictions, evictions
    for ls in (PROD, LS):
        assert node.kube.get("pods", ls.name, ls.namespace) is not None, f"LS pod {ls.key} is gone: {evictions}"
        assert not [p for p in evictions if f"/pods/{ls.name}/" in p], f"LS pod {ls.key} evicted: {evictions}"
    log.warning("acceptance eviction: memory %s %%, threshold %s %%, +%s MiB: %s", used, threshold, grow_mib, evictions)


async def _actuations(node: Node, loop: str, since: float) -> list[ActuationApplied]:
    """The agent's ActuationApplied of `loop` made at or after `since` (read at most every half second)."""
    await asyncio.sleep(0.5)
    events, _ = await suppression.agent_account(node.nats_url, NODE)
    return [e for e in events if e.loop == loop and e.at >= since]


MEMORY_QOS = {"enable": True, "minLimitPercent": 50, "lowLimitPercent": 80, "throttlingPercent": 0}
"""lsClass memory QoS: memory.min half and memory.low 80 % of each LS container's request, memory.high unthrottled."""
MEMORY_QOS_FILES = ("memory.min", "memory.low", "memory.high")


def _memory_qos_expected(node: Node, *, enabled: bool) -> dict[str, str]:
    """Spec §5.3 per container file of the pods still on the node: LS pods (lsClass) with MEMORY_QOS when `enabled`,
    every other class, and every class when not, the "none" values (0, 0, max)."""
    limits = {PROD.key: 256 * MIB, LS.key: None}
    requests = {PROD.key: 256 * MIB, LS.key: 128 * MIB}
    expected: dict[str, str] = {}
    for pod in PODS:
        if node.kube.get("pods", pod.name, pod.namespace) is None:
            continue
        if enabled and pod.key in requests:
            values = spec_memory_qos(requests[pod.key], limits[pod.key], MEMORY_QOS, node_memory=node.memory)
        else:
            values = {"memory.min": "0", "memory.low": "0", "memory.high": "max"}
        for name, value in values.items():
            expected[f"{pod.rel}/{pod.container_id}/{name}"] = value
    return expected


def _memory_qos_wrong(node: Node, expected: dict[str, str]) -> list[str]:
    wrong = []
    for rel, value in expected.items():
        found = node.hierarchy.path("memory", rel).read_text().strip()
        unlimited = value == "max" and (found == "max" or int(found) >= 1 << 62)
        if found != value and not unlimited:
            wrong.append(f"memory/{rel} = {found}, spec §5.3: {value}")
    return wrong


async def test_memory_qos_is_written_where_the_kernel_has_memory_min_and_one_problem_where_not(node: Node) -> None:
    """Issue 23.1's memory QoS with lsClass memoryQOS turned on in the slo-controller-config's resource-qos-config
    (rendered by the slo service into the NodeSLO's resourceQOSStrategy). This kernel's cgroup v1 memory controller has
    no memory.min / memory.low / memory.high (a mainline kernel; Alibaba's Anolis has them): the agent publishes
    exactly one problem, "not supported by this kernel", naming the Guaranteed directory's memory.min it probed,
    writes no memory QoS file, and the problem clears once memory QoS is off again. On a kernel with memory.min,
    every container's three files hold spec §5.3's values instead, and the "none" values again once it is off."""
    supported = node.hierarchy.path("memory", "kubepods").joinpath("memory.min").exists()
    probe = f"memory/{node.hierarchy.parent}/kubepods/memory.min"
    since = time.time()
    node.kube.put(
        "configmaps",
        _slo_config(
            suppress_percent=SUPPRESS_PERCENT,
            memory_evict_percent=99,
            extra={"resource-qos-config": {"clusterStrategy": {"lsClass": {"memoryQOS": MEMORY_QOS}}}},
        ),
    )
    try:

        def rendered() -> bool:
            slo = node.kube.get("NodeSLO", NODE) or {}
            qos = slo.get("spec", {}).get("resourceQOSStrategy") or {}
            return bool(qos.get("lsClass", {}).get("memoryQOS", {}).get("enable"))

        await eventually(rendered, timeout=30)
        if supported:
            expected = _memory_qos_expected(node, enabled=True)
            try:
                await eventually(lambda: not _memory_qos_wrong(node, expected), timeout=30)
            except AssertionError:
                wrong = _memory_qos_wrong(node, expected)
                raise AssertionError("memory QoS:\n" + "\n".join(wrong) + f"\n{node.agent.tail()}") from None
        else:

            async def reported() -> bool:
                return bool(await _actuations(node, "memory-qos", since))

            await eventually(reported, timeout=30)
            await asyncio.sleep(3 * 2)  # three reconcile rounds (KOORDBUS_RECONCILE_INTERVAL): no event repeats it
            events = await _actuations(node, "memory-qos", since)
            problems = [p for e in events for p in e.problems]
            assert len(problems) == 1 and len(events) == 1, [(e.at, e.problems, e.changes) for e in events]
            (problem,) = problems
            assert problem.target == probe and problem.reason.startswith("not supported by this kernel"), problem
            assert not events[0].changes, events[0].changes
    finally:
        node.kube.put("configmaps", _restored_config())
    events, _ = await suppression.agent_account(node.nats_url, NODE)
    written = sorted(c.path for e in events for c in e.changes if c.path.rsplit("/", 1)[-1] in MEMORY_QOS_FILES)
    if supported:
        expected = _memory_qos_expected(node, enabled=False)
        await eventually(lambda: not _memory_qos_wrong(node, expected), timeout=30)
        log.warning("acceptance memory qos: written on this kernel: %s files", len(written))
        return
    assert not written, f"memory QoS files written on a kernel without them: {written[:5]}"

    async def cleared() -> bool:
        events = await _actuations(node, "memory-qos", since)
        return len(events) >= 2 and not events[-1].problems and not events[-1].changes

    await eventually(cleared, timeout=30)
    log.warning("acceptance memory qos: not supported here: %s", problem.reason)


async def test_every_file_the_agent_wrote_is_inside_the_tests_cgroup_parent(node: Node) -> None:
    """--apply confined: the agent's own account of its writes (ActuationApplied) names only files of this tree."""
    bus = await JetStreamBus.connect(node.nats_url, name="acceptance-reader")
    try:
        stored = await bus.read_recent(
            streams.KOORD_NODE, subjects.stored(subjects.node_actuation(NODE)), since=0, limit=10_000
        )
    finally:
        await bus.close()
    events = [ACTUATION_DECODER.decode(d.data) for d in stored]
    assert events and not any(event.dry_run for event in events), f"{len(events)} events, dry runs among them"
    evicted = {c.path for e in events if e.loop in ("memory-evict", "cpu-evict") for c in e.changes}
    assert evicted <= {f"pods/{pod.key}" for pod in (BE_A, BE_B)}, f"evictions named {evicted}"
    paths = {c.path for e in events if e.loop not in ("memory-evict", "cpu-evict") for c in e.changes}
    outside = sorted(p for p in paths if p.split("/")[1:2] != [node.hierarchy.parent])
    assert paths and not outside, f"the agent wrote outside {node.hierarchy.parent}: {outside[:10]}"
    loops = sorted({event.loop for event in events})
    log.warning("acceptance confinement: %s files written by loops %s, all under the test's parent", len(paths), loops)


def test_teardown_removes_every_cgroup_and_process_also_after_a_failed_assertion() -> None:
    why = v1_writable()
    if why:
        pytest.skip(f"no writable cgroup v1 here ({why})")
    pod = PodSpec("teardown", "shop", "BestEffort")
    with pytest.raises(AssertionError, match="a failing test"), running_hierarchy() as hierarchy:
        hierarchy.add_pod(pod)
        burner = hierarchy.start(pod, share=0.05, mib=8)
        assert burner.pid in hierarchy.tasks()
        raise AssertionError("a failing test")
    assert burner.process.poll() is not None, "the burner still runs"
    assert hierarchy.leftovers() == []
    assert not [c for c in hierarchy.controllers if hierarchy.path(c).exists()]
