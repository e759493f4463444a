"""The agent's topology report on disk (issue 23.4): `read_topology` over generated sysfs and procfs trees of 1, 2 and
4 NUMA nodes (online CPUs, their topology files, each node's cpulist, meminfo and huge pages), with hyper-threading on
and off, the turbo files, and the kubelet's CPU manager state file in each shape; over this machine's real /sys and
/proc; and the reporter publishing through a real nats-server into KOORD_NODE, a changed state file giving a new
report."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import msgspec
import pytest

from agent import topology
from agent.settings import AgentSettings
from agent.suppress import format_cpuset, parse_cpuset
from agent.topology_watch import read_topology, reporter_for
from bus import streams, subjects
from bus.jetstream import JetStreamBus
from schemas import node_topology as nt
from schemas.node_topology import TOPOLOGY_DECODER, encode_topology
from tests.support.waiting import eventually

GiB = 1024**3
MiB = 1024**2
NODE = "topo-node"
UID_A = "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b"
UID_B = "1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"


class SysfsMachine:
    """`nodes` sockets, one NUMA node each, of `cores` cores with `threads` hyper-threads, numbered as Linux numbers
    them (first threads of every core of every socket, then the siblings); each node 16 GiB, node n with n × 2 MiB
    pages and node 1 with one 1 GiB page. `numa_dirs=False`: no node directories (one zone from /proc/meminfo)."""

    def __init__(self, root: Path, *, nodes: int, cores: int = 2, threads: int = 2, numa_dirs: bool = True) -> None:
        self.sys_root, self.proc_root, self.kubelet_root = root / "sys", root / "proc", root / "kubelet"
        self.nodes, self.cores, self.threads = nodes, cores, threads
        self.count = nodes * cores * threads
        cpu_dir = self.sys_root / "devices/system/cpu"
        self.write(cpu_dir / "online", f"0-{self.count - 1}\n")
        members: dict[int, list[int]] = {n: [] for n in range(nodes)}
        for cpu in range(self.count):
            socket, core = (cpu % (nodes * cores)) // cores, cpu % cores
            self.write(cpu_dir / f"cpu{cpu}/topology/core_id", f"{core}\n")
            self.write(cpu_dir / f"cpu{cpu}/topology/physical_package_id", f"{socket}\n")
            members[socket].append(cpu)
        self.members = members
        if numa_dirs:
            for n in range(nodes):
                d = self.sys_root / f"devices/system/node/node{n}"
                self.write(d / "cpulist", f"{format_cpuset(members[n])}\n")
                self.write(d / "meminfo", f"Node {n} MemTotal:       {16 * GiB // 1024} kB\nNode {n} MemFree: 1 kB\n")
                self.write(d / "hugepages/hugepages-2048kB/nr_hugepages", f"{n}\n")
                self.write(d / "hugepages/hugepages-1048576kB/nr_hugepages", "1\n" if n == 1 else "0\n")
        self.write(self.proc_root / "meminfo", f"MemTotal:       {nodes * 16 * GiB // 1024} kB\nMemFree: 1 kB\n")
        block = "processor\t: {}\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Gold 6348 CPU @ 2.60GHz\n\n"
        self.write(self.proc_root / "cpuinfo", "".join(block.format(i) for i in range(self.count)))
        self.kubelet_root.mkdir()

    @staticmethod
    def write(path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)

    def state(self, content: str) -> None:
        """Write the kubelet's state file as the kubelet does: whole, by renaming a complete one over it."""
        path = self.kubelet_root / "cpu_manager_state"
        (self.kubelet_root / ".tmp").write_text(content)
        os.replace(self.kubelet_root / ".tmp", path)

    def read(self, *, reserved_cpus: str = "") -> nt.NodeTopologyReported:
        report = read_topology(
            node=NODE,
            at=1000.0,
            sys_root=str(self.sys_root),
            proc_root=str(self.proc_root),
            kubelet_root_dir=str(self.kubelet_root),
            reserved_cpus=reserved_cpus,
        )
        assert TOPOLOGY_DECODER.decode(encode_topology(report)) == report
        return report


@pytest.mark.parametrize(("nodes", "threads"), [(1, 1), (1, 2), (2, 1), (2, 2), (4, 1), (4, 2)])
def test_generated_machines(tmp_path: Path, nodes: int, threads: int) -> None:
    machine = SysfsMachine(tmp_path, nodes=nodes, threads=threads)
    report = machine.read()
    assert report.problems == []
    assert [z.numa for z in report.zones] == list(range(nodes))
    for zone in report.zones:
        n = zone.numa
        assert parse_cpuset(zone.cpus) == set(machine.members[n]) and zone.cpu_count == 2 * threads
        assert zone.hugepages_2mi == n * 2 * MiB and zone.hugepages_1gi == (GiB if n == 1 else 0)
        assert zone.memory == 16 * GiB - zone.hugepages_2mi - zone.hugepages_1gi
    assert [(c.id, c.socket, c.numa) for c in report.cpus] == [
        (cpu, n, n) for cpu in range(machine.count) for n in machine.members if cpu in machine.members[n]
    ]
    assert report.basic == nt.CpuBasicInfo(
        cpu_model="Intel(R) Xeon(R) Gold 6348 CPU @ 2.60GHz", vendor_id="GenuineIntel", hyper_thread_enabled=threads > 1
    )
    assert report.kubelet == nt.KubeletCpuManager()  # no state file: policy none


def test_a_machine_without_numa_directories_is_one_zone(tmp_path: Path) -> None:
    machine = SysfsMachine(tmp_path, nodes=1, cores=4, numa_dirs=False)
    machine.write(machine.sys_root / "kernel/mm/hugepages/hugepages-2048kB/nr_hugepages", "256\n")
    report = machine.read()
    assert report.problems == []
    assert report.zones == [
        nt.NumaZoneReport(numa=0, cpus="0-7", cpu_count=8, memory=31 * GiB // 2, hugepages_2mi=GiB // 2)
    ]


def test_offline_cpus_are_left_out(tmp_path: Path) -> None:
    machine = SysfsMachine(tmp_path, nodes=2)
    machine.write(machine.sys_root / "devices/system/cpu/online", "0-5,7\n")  # cpu 6 offline; node0 still names it
    report = machine.read()
    assert report.problems == []
    assert [(z.cpus, z.cpu_count) for z in report.zones] == [("0-1,4-5", 4), ("2-3,7", 3)]
    assert 6 not in {c.id for c in report.cpus}


@pytest.mark.parametrize(
    ("no_turbo", "boost", "on"),
    [("0", None, True), ("1", "1", False), (None, "1", True), (None, "0", False), (None, None, False)],
)
def test_turbo_files(tmp_path: Path, no_turbo: str | None, boost: str | None, on: bool) -> None:
    machine = SysfsMachine(tmp_path, nodes=1)
    cpu_dir = machine.sys_root / "devices/system/cpu"
    if no_turbo is not None:
        machine.write(cpu_dir / "intel_pstate/no_turbo", f"{no_turbo}\n")
    if boost is not None:
        machine.write(cpu_dir / "cpufreq/boost", f"{boost}\n")
    assert machine.read().basic.turbo_enabled is on


def test_the_kubelet_state_file_none_and_static(tmp_path: Path) -> None:
    machine = SysfsMachine(tmp_path, nodes=2)
    machine.state('{"policyName":"none","defaultCpuSet":"","checksum":1353318690}')
    assert machine.read().kubelet == nt.KubeletCpuManager(policy="none")
    state = {
        "policyName": "static",
        "defaultCpuSet": "0,2-3,6-7",
        "entries": {UID_B: {"main": "5"}, UID_A: {"main": "1", "sidecar": "4"}},
        "checksum": 2611786520,
    }
    machine.state(json.dumps(state))
    report = machine.read(reserved_cpus="0")
    assert report.problems == []
    assert report.kubelet == nt.KubeletCpuManager(
        policy="static",
        default_cpus="0,2-3,6-7",
        reserved_cpus="0",
        pod_allocs=[nt.PodCpuAlloc(uid=UID_A, cpus="1,4"), nt.PodCpuAlloc(uid=UID_B, cpus="5")],
    )


@pytest.mark.parametrize(
    ("write", "problem"),
    [
        (lambda path: path.write_text('{"policyName": "static", "entries": {'), "not a CPU manager checkpoint"),
        (
            lambda path: path.write_text('{"policyName": "static", "defaultCpuSet": "0-3,z"}'),
            "defaultCpuSet: bad cpuset '0-3,z'",
        ),
        (lambda path: path.write_bytes(b"{" + b" " * (1 << 20) + b"}"), "larger than 1048576 bytes"),
        (lambda path: path.mkdir(), "cannot read: Is a directory"),
    ],
)
def test_a_bad_kubelet_state_file_is_a_problem(tmp_path: Path, write: object, problem: str) -> None:
    machine = SysfsMachine(tmp_path, nodes=1)
    path = machine.kubelet_root / "cpu_manager_state"
    write(path)  # type: ignore[operator]
    report = machine.read(reserved_cpus="0-1")
    assert report.kubelet == nt.KubeletCpuManager(reserved_cpus="0-1")
    assert len(report.problems) == 1 and report.problems[0].startswith(f"{path}: {problem}")


def test_unreadable_sysfs_is_a_problem_not_a_crash(tmp_path: Path) -> None:
    machine = SysfsMachine(tmp_path, nodes=2)
    (machine.sys_root / "devices/system/cpu/online").unlink()
    meminfo = machine.sys_root / "devices/system/node/node1/meminfo"
    meminfo.unlink()
    meminfo.mkdir()
    report = machine.read()
    assert report.cpus == []
    cpu_dir = f"{machine.sys_root}/devices/system/cpu"
    assert report.problems == [
        f"the CPUs under {cpu_dir}: cannot read {cpu_dir}/online",
        f"{meminfo}: cannot read: Is a directory",
    ]
    assert [(z.cpu_count, z.memory) for z in report.zones] == [(4, 16 * GiB), (4, 0)]


def test_the_topology_of_this_machine() -> None:
    """The real sysfs and procfs: only what is surely true of any machine."""
    report = read_topology(node="this-host", at=1000.0, sys_root="/sys", proc_root="/proc", kubelet_root_dir="/nowhere")
    assert TOPOLOGY_DECODER.decode(encode_topology(report)) == report
    online = parse_cpuset(Path("/sys/devices/system/cpu/online").read_text())
    assert len(report.cpus) >= 1 and {c.id for c in report.cpus} == online
    zoned = [cpu for zone in report.zones for cpu in parse_cpuset(zone.cpus)]
    assert sorted(zoned) == sorted(online)  # every online CPU in exactly one zone
    assert sum(z.cpu_count for z in report.zones) == len(online)
    assert sum(z.memory for z in report.zones) > 0
    assert report.kubelet.policy == "none"


async def test_the_reporter_publishes_into_koord_node_and_again_when_the_kubelet_changes(
    tmp_path: Path, koordbus_bus: JetStreamBus
) -> None:
    machine = SysfsMachine(tmp_path, nodes=2)
    settings = AgentSettings(
        node_name=NODE,
        sys_root=str(machine.sys_root),
        proc_root=str(machine.proc_root),
        kubelet_root_dir=str(machine.kubelet_root),
        topology_interval_seconds=0.05,
    )
    reporter = reporter_for(settings, koordbus_bus, reserved_cpus="0")
    stored = subjects.stored(subjects.node_topology(NODE))

    async def latest() -> nt.NodeTopologyReported | None:
        delivery = await koordbus_bus.last_on_subject(streams.KOORD_NODE, stored)
        return None if delivery is None else TOPOLOGY_DECODER.decode(delivery.data)

    async def static_reported() -> bool:
        report = await latest()
        return report is not None and report.kubelet.policy == "static"

    task = asyncio.create_task(reporter.run())
    try:
        await eventually(lambda: reporter.stats.reports_sent >= 1, timeout=30)
        first = await latest()
        assert first is not None and first.node == NODE and first.problems == []
        assert [z.cpu_count for z in first.zones] == [4, 4] and first.kubelet.reserved_cpus == "0"
        sent = reporter.stats.reports_sent
        machine.state(json.dumps({"policyName": "static", "defaultCpuSet": "0,2-7", "entries": {UID_A: {"c": "1"}}}))
        await eventually(static_reported, timeout=30)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
    second = await latest()
    assert second is not None and second.at > first.at
    assert second.kubelet.pod_allocs == [nt.PodCpuAlloc(uid=UID_A, cpus="1")]
    assert topology.same_topology(second, msgspec.structs.replace(first, kubelet=second.kubelet))
    assert reporter.stats.reports_sent == sent + 1  # an unchanged topology is not sent again within the refresh
