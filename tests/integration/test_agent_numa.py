"""The agent's NUMA usage on disk (issue 22, point 3): the collector over generated sysfs trees of 2 and 4 NUMA nodes
(per-CPU /proc/stat lines, each node's cpulist and meminfo, the pods' memory.numa_stat in cgroup v1 and v2) and over
this machine's real /sys and /proc, through the sampler into the batch the agent publishes."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from agent import collect, core
from agent.batch import BatchBuilder
from agent.settings import AgentSettings
from schemas.node import NODE_EVENT_DECODER, encode_node_event
from tests.cgroup_tree import FakeCgroupTree, MiB, pod_rel
from tests.integration.test_agent_collect import UID_B, UID_G, settings_for

TCK = collect.clock_ticks_per_second()
PAGE = os.sysconf("SC_PAGE_SIZE")


class NumaMachine:
    """A FakeCgroupTree plus `nodes` NUMA nodes of `cpus_per_node` CPUs each, their meminfo and per-CPU ticks."""

    def __init__(self, tmp_path: Path, version: int, nodes: int, cpus_per_node: int = 2) -> None:
        self.tree = FakeCgroupTree(root=tmp_path / "node", version=version, driver="cgroupfs")
        self.tree.proc.cpus = nodes * cpus_per_node
        self.tree.add_pod(UID_G, "Guaranteed", active_anon=300 * MiB)
        self.tree.add_pod(UID_B, "Burstable", active_anon=100 * MiB)
        self.sys_root = tmp_path / "sys"
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.busy = [0] * (nodes * cpus_per_node)
        for n in range(nodes):
            d = self.sys_root / "devices/system/node" / f"node{n}"
            d.mkdir(parents=True)
            first = n * cpus_per_node
            (d / "cpulist").write_text(f"{first}-{first + cpus_per_node - 1}\n")
            # node n: 8 GiB, of which (1 + n) GiB free, 512 MiB file pages and 256 MiB reclaimable slab
            kb = {"MemTotal": 8 << 20, "MemFree": (1 + n) << 20, "Active(file)": 256 << 10, "Inactive(file)": 256 << 10}
            kb["SReclaimable"] = 256 << 10
            (d / "meminfo").write_text("".join(f"Node {n} {k}: {v} kB\n" for k, v in kb.items()))
        self.write()

    def used(self, n: int) -> int:
        return (8 * 1024 - (1 + n) * 1024 - 768) * MiB

    def pod_numa_stat(self, uid: str, kube_qos: str, per_node: list[int]) -> None:
        """Write a pod's memory.numa_stat: `per_node` bytes on each NUMA node."""
        rel = pod_rel(self.tree.driver, uid, kube_qos)
        nodes = " ".join(f"N{n}={b}" for n, b in enumerate(per_node))
        if self.tree.version == 1:
            pages = " ".join(f"N{n}={b // PAGE}" for n, b in enumerate(per_node))
            text = f"total=1 N0=1\nhierarchical_total={sum(per_node) // PAGE} {pages}\n"
            path = self.tree.cgroup_root / "memory" / rel / "memory.numa_stat"
        else:
            text = f"anon {nodes}\nfile {' '.join(f'N{n}=0' for n in range(len(per_node)))}\n"
            path = self.tree.cgroup_root / rel / "memory.numa_stat"
        path.write_text(text)

    def write(self) -> None:
        self.tree.write()
        stat = self.tree.proc_root / "stat"
        lines = stat.read_text().splitlines()
        per_cpu = [f"cpu{i} {b} 0 0 1000 0 0 0 0 0 0" for i, b in enumerate(self.busy)]
        stat.write_text("\n".join([lines[0], *per_cpu, *lines[1 + self.tree.proc.cpus :]]) + "\n")

    def advance(self, seconds: float, cores_per_node: list[float]) -> None:
        for n, cores in enumerate(cores_per_node):
            for c in range(self.cpus_per_node):
                self.busy[n * self.cpus_per_node + c] += int(cores / self.cpus_per_node * TCK * seconds)
        self.tree.proc.user += int(sum(cores_per_node) * TCK * seconds)
        for cg in self.tree.cgroups.values():
            cg.cpu_ns += int(0.25 * seconds * 1e9)
        self.write()


@pytest.mark.parametrize(("version", "nodes"), [(1, 2), (2, 2), (1, 4), (2, 4)])
def test_numa_usage_of_generated_machines_reaches_the_batch(tmp_path: Path, version: int, nodes: int) -> None:
    machine = NumaMachine(tmp_path, version, nodes)
    machine.pod_numa_stat(UID_G, "Guaranteed", [200 * MiB] + [100 * MiB // (nodes - 1)] * (nodes - 1))
    machine.pod_numa_stat(UID_B, "Burstable", [0] * (nodes - 1) + [100 * MiB])
    settings = settings_for(machine.tree, sys_root=str(machine.sys_root))
    collector, sampler, builder = (
        collect.Collector(settings),
        core.Sampler(),
        BatchBuilder("node-a.example", interval=10),
    )
    first = collector(1000.0)
    assert [(r.id, r.memory) for r in first.numa] == [(n, machine.used(n)) for n in range(nodes)]
    assert sampler.observe(first).numa == ()  # no CPU baseline yet
    cores = [0.5 + n for n in range(nodes)]
    machine.advance(2.0, cores)
    tick = sampler.observe(collector(1002.0))
    by_id = {s.id: s for s in tick.numa}
    assert sorted(by_id) == list(range(nodes))
    assert [by_id[n].cpu for n in range(nodes)] == pytest.approx(cores)
    on_node = [200 * MiB] + [100 * MiB // (nodes - 1)] * (nodes - 1)  # UID_G's, then UID_B's on the last node
    on_node[-1] += 100 * MiB
    for n in range(nodes):
        assert abs(by_id[n].system_memory - (machine.used(n) - on_node[n])) <= PAGE * 2  # v1 counts whole pages
    assert tick.system is not None
    assert sum(s.system_cpu for s in tick.numa) == pytest.approx(tick.system[1])
    assert [s.system_cpu / tick.system[1] for s in tick.numa] == pytest.approx([c / sum(cores) for c in cores])
    builder.add(tick)
    batch = builder.close(sent_at=1010.0)
    assert batch is not None and [row[1] for row in batch.numa_samples] == list(range(nodes))
    assert NODE_EVENT_DECODER.decode(encode_node_event(batch)) == batch


def test_a_machine_without_numa_nodes_reports_none_and_a_broken_node_is_left_out(tmp_path: Path) -> None:
    machine = NumaMachine(tmp_path, 1, 2)
    no_numa = collect.Collector(settings_for(machine.tree, sys_root=str(tmp_path / "empty-sys")))
    assert no_numa(1000.0).numa == ()
    (machine.sys_root / "devices/system/node/node1/meminfo").write_text("garbage\n")
    collector = collect.Collector(settings_for(machine.tree, sys_root=str(machine.sys_root)))
    assert [r.id for r in collector(1000.0).numa] == [0]


def test_the_numa_usage_of_this_machine() -> None:
    """The real sysfs and procfs: every NUMA node's memory within the machine's, CPU within its CPUs."""
    if not Path("/sys/devices/system/node/node0").is_dir():
        pytest.skip("this machine's sysfs lists no NUMA nodes")
    settings = AgentSettings(node_name="this-host")
    collector, sampler = collect.Collector(settings), core.Sampler()
    sampler.observe(collector(time.time()))
    time.sleep(0.3)
    reading = collector(time.time())
    tick = sampler.observe(reading)
    total = collect.read_meminfo("/proc").total_kb * 1024
    assert reading.numa and all(0 <= r.memory <= total for r in reading.numa)
    assert tick.numa and all(0 <= s.cpu <= (os.cpu_count() or 1) + 0.5 for s in tick.numa)
    assert all(0 <= s.system_memory <= s.memory for s in tick.numa)
