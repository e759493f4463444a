"""What this machine's kernel says and allows, as the acceptance suite reads it itself for the checks of issue 23's
node-agent features (tests/acceptance/test_node_acceptance.py): the online CPUs, NUMA nodes, CPU model,
hyper-threading and turbo from sysfs and procfs (the NodeResourceTopology and CPU normalization checks), the node's
pressure stall totals from /proc/pressure (the PSI check), the kubelet CPU manager checkpoint the suite's agent reads,
the agent's /metrics, and the CPI rows of the agent's batches. The code under test reads the same files its own way
(agent.topology, agent.psi); whether perf_event_open counts hardware events here is asked of agent.perf.probe, the
one perf_event_open the agent itself makes, from the test's process (root, like the agent).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from schemas.cpi import PodCpiSample
from schemas.node import NodeMetricsReported

SYS = Path("/sys")
PROC = Path("/proc")
PRESSURE = PROC / "pressure"
RESOURCES = ("cpu", "memory", "io")


def cpu_list(text: str) -> frozenset[int]:
    """The kernel's cpu list ("0-3,8") as a set of ids."""
    ids: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        first, _, last = part.partition("-")
        ids.update(range(int(first), int(last or first) + 1))
    return frozenset(ids)


def cpu_list_text(ids: Iterable[int]) -> str:
    """The kernel's (and Koordinator's cpuset String()) list form of `ids`: "0-3,8"."""
    spans: list[list[int]] = []
    for cpu in sorted(set(ids)):
        if spans and cpu == spans[-1][1] + 1:
            spans[-1][1] = cpu
        else:
            spans.append([cpu, cpu])
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in spans)


@dataclass(frozen=True)
class Machine:
    """This machine's CPUs and memory as sysfs and procfs say."""

    online: frozenset[int]
    numa: dict[int, frozenset[int]]
    """NUMA node → its online CPUs (node 0 holding every online CPU where sysfs lists no NUMA nodes)."""
    numa_memory: dict[int, int]
    """NUMA node → its MemTotal, bytes, when read (numa_memory(): it can change)."""
    model: str
    """/proc/cpuinfo's first `model name` ("" where it has none)."""
    hyper_threads: bool
    """Some core (package, core id) has two online logical CPUs."""
    turbo: bool
    """intel_pstate's no_turbo is 0, else cpufreq's boost is 1."""


def _mem_total(text: str) -> int:
    for line in text.splitlines():
        fields = line.split()
        if "MemTotal:" in fields:
            return int(fields[fields.index("MemTotal:") + 1]) * 1024
    raise AssertionError(f"no MemTotal in {text[:200]!r}")


def _numa_nodes() -> list[int]:
    node_dir = SYS / "devices/system/node"
    return sorted(int(p.name[4:]) for p in node_dir.glob("node[0-9]*")) if node_dir.is_dir() else []


def numa_memory() -> dict[int, int]:
    """NUMA node → its MemTotal now, bytes. It changes on this VM (memory plugged in as it runs: node 0 read 8.0 GB
    and, a few minutes later, 8.1 GB and then 11 GB), so compare what the agent read with a reading before and after."""
    nodes = _numa_nodes()
    if nodes:
        return {n: _mem_total((SYS / f"devices/system/node/node{n}/meminfo").read_text()) for n in nodes}
    return {0: _mem_total((PROC / "meminfo").read_text())}


def machine() -> Machine:
    online = cpu_list((SYS / "devices/system/cpu/online").read_text())
    nodes = _numa_nodes()
    if nodes:
        numa = {n: cpu_list((SYS / f"devices/system/node/node{n}/cpulist").read_text()) & online for n in nodes}
    else:
        numa = {0: online}
    numa_memory_then = numa_memory()
    model = ""
    for line in (PROC / "cpuinfo").read_text().splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            model = value.strip()
            break
    cores: set[tuple[str, str]] = set()
    hyper_threads = False
    for cpu in sorted(online):
        topology = SYS / f"devices/system/cpu/cpu{cpu}/topology"
        core = ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
        hyper_threads |= core in cores
        cores.add(core)
    no_turbo = SYS / "devices/system/cpu/intel_pstate/no_turbo"
    boost = SYS / "devices/system/cpu/cpufreq/boost"
    if no_turbo.exists():
        turbo = no_turbo.read_text().strip() == "0"
    else:
        turbo = boost.exists() and boost.read_text().strip() == "1"
    return Machine(
        online=online, numa=numa, numa_memory=numa_memory_then, model=model, hyper_threads=hyper_threads, turbo=turbo
    )


def cpu_manager_state(*, pod_uid: str, container: str, pinned: frozenset[int], online: frozenset[int]) -> str:
    """The kubelet's `cpu_manager_state` checkpoint (CPUManagerCheckpointV2) of the static policy with one pod's
    container holding `pinned` (its checksum is not checked by the agent)."""
    return json.dumps(
        {
            "policyName": "static",
            "defaultCpuSet": cpu_list_text(online - pinned),
            "entries": {pod_uid: {container: cpu_list_text(pinned)}},
            "checksum": 0,
        }
    )


# --- PSI


def pressure_totals(root: Path = PRESSURE) -> dict[str, int]:
    """The `total` counters (µs) of /proc/pressure's files by signal ("cpu_some", "io_full", …): only the files and
    lines this kernel has (none without PSI)."""
    totals: dict[str, int] = {}
    for resource in RESOURCES:
        try:
            text = (root / resource).read_text()
        except OSError:  # absent, or EOPNOTSUPP with psi=0
            continue
        for line in text.splitlines():
            kind, *fields = line.split()
            for field in fields:
                key, _, value = field.partition("=")
                if key == "total":
                    totals[f"{resource}_{kind}"] = int(value)
    return totals


def stall_ratio(samples: Sequence[tuple[float, dict[str, int]]], signal: str, start: float, end: float) -> float:
    """Δtotal / Δwall of `signal` between the test's samples nearest to `start` and `end`."""
    first = min(samples, key=lambda s: abs(s[0] - start))
    last = min(samples, key=lambda s: abs(s[0] - end))
    return (last[1][signal] - first[1][signal]) / 1e6 / (last[0] - first[0])


def pod_pressure_files(cgroup_dirs: Iterable[Path]) -> list[Path]:
    """The pressure files a pod cgroup of the suite's v1 tree has (none on a mainline kernel: PSI per cgroup is a
    cgroup v2 interface)."""
    return [d / f"{r}.pressure" for d in cgroup_dirs for r in RESOURCES if (d / f"{r}.pressure").exists()]


# --- the agent's own account


async def agent_metrics(port: int, node: str) -> dict[str, float]:
    """The agent's /metrics samples of `node` by sample name and part ("koordbus_agent_cpi_unavailable/metrics")."""
    async with httpx.AsyncClient(timeout=10) as client:
        response = await client.get(f"http://127.0.0.1:{port}/metrics")
    response.raise_for_status()
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            if sample.labels.get("node") == node:
                out[f"{sample.name}/{sample.labels.get('part', '')}"] = sample.value
    return out


def cpi_rows(batches: Sequence[NodeMetricsReported]) -> list[tuple[str, PodCpiSample]]:
    """(pod uid, row) of every CPI row of the batches, the pod found in the batch's list or the list its digest
    names (an earlier batch's)."""
    lists: dict[int, list[Any]] = {}
    rows: list[tuple[str, PodCpiSample]] = []
    for batch in batches:
        if batch.pods:
            lists[batch.pods_digest] = list(batch.pods)
        pods = list(batch.pods) or lists.get(batch.pods_digest, [])
        for row in batch.pod_cpi:
            rows.append((pods[row.pod].uid if row.pod < len(pods) else f"<index {row.pod}>", row))
    return rows


def log_count(text: str, needle: str) -> int:
    return sum(needle in line for line in text.splitlines())
