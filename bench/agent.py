"""Agent overhead benchmark: the metrics half at 1 s collection and every QoS loop on, over a generated node; prints
one JSON line.

Run as `python bench/agent.py [--pods 200] [--seconds 60]`. It lays out a cgroup v1 cgroupfs tree with --pods pods
(two containers each; half are BE pods with batch resources, the rest LS) and a resctrl tree with the LSR/LS/BE
groups, puts a NodeSLO that enables resctrl QoS for every class, CPU suppress (cpuset), BE CPU satisfaction and
memory eviction, and CPU burst (auto) into an in-memory bus, and runs the agent's AgentService (collect every second,
publish every 10 s) and QosLoops (apply mode, a round every second, the pod list from memory, usage from the
collector) together in this process for --seconds. Reports the process's CPU time per wall second
(user + system, as a percent of one core) and its peak RSS. The first rounds write every pod's values; they run
before the measured period, so what is measured is the steady state (later writes come from CPU suppress following
this machine's real load). Target of the issue: < 2% of one core, < 60 MB RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import shlex
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

if __package__ in (None, ""):  # run as a script: make the repository importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.actuate import NodePod
from agent.pods import PodList
from agent.qos_loops import QosLoops
from agent.service import AgentService
from agent.settings import AgentSettings, QosSettings
from bus import streams, subjects
from bus.memory import MemoryBus
from schemas import kube
from schemas.qos import NodeSloRendered

CPU_TARGET_PERCENT = 2.0
RSS_TARGET_MB = 60.0
NODE = "bench-node"
CPUS = 16
MEMORY_STAT = "total_inactive_anon 1048576\ntotal_active_anon 2097152\ntotal_unevictable 0\n"
MEMORY_STAT += "total_active_file 1048576\ntotal_inactive_file 1048576\n"
BATCH = json.dumps(
    {
        "containers": {
            f"c{i}": {
                "requests": {"kubernetes.io/batch-cpu": "500", "kubernetes.io/batch-memory": "1Gi"},
                "limits": {"kubernetes.io/batch-cpu": "1000", "kubernetes.io/batch-memory": "2Gi"},
            }
            for i in range(2)
        }
    }
)


def _cgroup(root: Path, rel: str, kernel_defaults: bool) -> None:
    for hierarchy in ("cpu", "cpuacct", "memory"):
        (root / hierarchy / rel).mkdir(parents=True, exist_ok=True)
    (root / "cpuacct" / rel / "cpuacct.usage").write_text("123456789\n")
    (root / "memory" / rel / "memory.stat").write_text(MEMORY_STAT)
    (root / "cpuset" / rel).mkdir(parents=True, exist_ok=True)
    (root / "cpuset" / rel / "cpuset.cpus").write_text(f"0-{CPUS - 1}\n")
    if kernel_defaults:
        (root / "cpu" / rel / "cpu.stat").write_text("nr_periods 0\nnr_throttled 0\nthrottled_time 0\n")
        (root / "cpu" / rel / "cpu.cfs_burst_us").write_text("0\n")
        (root / "cpu" / rel / "cpu.shares").write_text("1024\n")
        (root / "cpu" / rel / "cpu.cfs_quota_us").write_text("-1\n")
        (root / "cpu" / rel / "tasks").write_text("")
        (root / "memory" / rel / "memory.limit_in_bytes").write_text("9223372036854771712\n")


def build_node(base: Path, pods: int) -> tuple[Path, Path, list[NodePod]]:
    cgroups, resctrl = base / "cgroup", base / "resctrl"
    for qos_dir in ("kubepods", "kubepods/burstable", "kubepods/besteffort"):
        _cgroup(cgroups, qos_dir, kernel_defaults=True)
    node_pods: list[NodePod] = []
    for i in range(pods):
        uid = str(uuid.UUID(int=i + 1))
        be = i % 2 == 0
        kube_qos = "BestEffort" if be else "Burstable"
        qos_dir = "kubepods/besteffort" if be else "kubepods/burstable"
        containers = {f"c{c}": ("containerd", uuid.UUID(int=(i + 1) * 10 + c).hex * 2) for c in range(2)}
        _cgroup(cgroups, f"{qos_dir}/pod{uid}", kernel_defaults=True)
        for runtime_id in containers.values():
            _cgroup(cgroups, f"{qos_dir}/pod{uid}/{runtime_id[1]}", kernel_defaults=True)
        pod = msgspec.convert(
            {
                "metadata": {
                    "name": f"pod-{i}",
                    "namespace": "bench",
                    "uid": uid,
                    "resourceVersion": str(1000 + i),
                    "labels": {"koordinator.sh/qosClass": "BE" if be else "LS"},
                    "annotations": {"node.koordinator.sh/extended-resource-spec": BATCH} if be else {},
                },
                "spec": {
                    "containers": [
                        {"name": name, **({} if be else {"resources": {"limits": {"cpu": "1"}}})} for name in containers
                    ]
                },
                "status": {"phase": "Running", "qosClass": kube_qos},
            },
            kube.Pod,
        )
        node_pods.append(NodePod(pod=pod, containers=containers))
    (resctrl / "info/L3").mkdir(parents=True)
    (resctrl / "info/MB").mkdir(parents=True)
    (resctrl / "info/L3/cbm_mask").write_text("7ff\n")
    (resctrl / "schemata").write_text("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n")
    for group in ("LSR", "LS", "BE"):
        (resctrl / group).mkdir()
        (resctrl / group / "schemata").write_text("    L3:0=7ff;1=7ff\n    MB:0=100;1=100\n")
        (resctrl / group / "tasks").write_text("")
    return cgroups, resctrl, node_pods


def build_sys(root: Path) -> Path:
    """A sysfs with CPUS CPUs, hyper-thread pairs (n, n + CPUS/2), one socket."""
    base = root / "devices/system/cpu"
    base.mkdir(parents=True)
    (base / "online").write_text(f"0-{CPUS - 1}\n")
    for cpu in range(CPUS):
        (base / f"cpu{cpu}/topology").mkdir(parents=True)
        (base / f"cpu{cpu}/topology/core_id").write_text(f"{cpu % (CPUS // 2)}\n")
        (base / f"cpu{cpu}/topology/physical_package_id").write_text("0\n")
    return root


class StaticPods:
    def __init__(self, pods: list[NodePod]) -> None:
        self._pods = pods

    async def list(self) -> PodList:
        return PodList(pods=self._pods, unreadable=0)


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def run(pods: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="koordbus-bench-agent-") as tmp:
        cgroups, resctrl, node_pods = build_node(Path(tmp), pods)
        bus = MemoryBus()
        await bus.ensure_streams([streams.slo_stream(), streams.node_stream()])
        resctrl_on = {"resctrlQOS": {"enable": True}}
        spec = {
            "resourceUsedThresholdWithBE": {
                "enable": True,
                "cpuSuppressPolicy": "cpuset",
                "cpuEvictBESatisfactionLowerPercent": 60,
                "cpuEvictBESatisfactionUpperPercent": 80,
            },
            "resourceQOSStrategy": {"lsrClass": resctrl_on, "lsClass": resctrl_on, "beClass": resctrl_on},
            "cpuBurstStrategy": {"policy": "auto"},
        }
        value = NodeSloRendered(node=NODE, spec=spec, rendered_at=time.time())
        await bus.publish(subjects.slo_key(NODE), msgspec.json.encode(value), msg_id="bench-slo")
        settings = AgentSettings(node_name=NODE, cgroup_root=str(cgroups), cgroup_version=1, cgroup_driver="cgroupfs")
        qos_settings = QosSettings(
            qos_mode="apply",
            resctrl_root=str(resctrl),
            state_dir=str(Path(tmp) / "state"),
            sys_root=str(build_sys(Path(tmp) / "sys")),
            evict_features="BEMemoryEvict,BECPUEvict",
        )
        agent = AgentService(settings, bus)
        loops = QosLoops(settings, qos_settings, bus, pods=StaticPods(node_pods), usage=lambda: agent.latest_tick)
        await agent.collect_once()
        await asyncio.sleep(1.0)
        await agent.collect_once()  # two readings: the first usage samples
        # The first rounds write every pod's values (at most max_writes_per_round each): not the steady state.
        for _ in range(20):
            before = loops.stats.writes
            await loops.round()
            if loops.stats.writes == before:
                break
        first_writes = loops.stats.writes
        tasks = [asyncio.create_task(agent.run()), asyncio.create_task(loops.run())]
        start_cpu, start_wall = time.process_time(), time.monotonic()
        await asyncio.sleep(seconds)
        cpu, wall = time.process_time() - start_cpu, time.monotonic() - start_wall
        await agent.stop()
        await loops.stop()
        await asyncio.gather(*tasks)
        cpu_percent = 100 * cpu / wall
        rss = _rss_mb()
        return {
            "bench": "agent",
            "pods": pods,
            "seconds": round(wall, 1),
            "cpu_percent_of_one_core": round(cpu_percent, 2),
            "peak_rss_mb": round(rss, 1),
            "qos_rounds": loops.stats.rounds,
            "collections": agent.stats.collections,
            "convergence_writes": first_writes,
            "steady_writes": loops.stats.writes - first_writes,
            "qos_problems": loops.stats.problems,
            "target_held": cpu_percent < CPU_TARGET_PERCENT and rss < RSS_TARGET_MB,
            "command": shlex.join(["python", "bench/agent.py", *sys.argv[1:]]),
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pods", type=int, default=200, help="pods on the generated node (default 200)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to run both halves (default 60)")
    args = parser.parse_args()
    if args.pods < 1 or args.seconds <= 0:
        parser.error("--pods must be at least 1 and --seconds positive")
    print(json.dumps(asyncio.run(run(args.pods, args.seconds))), flush=True)


if __name__ == "__main__":
    main()
