"""A simulated node's topology report (`koordbus up --simulate-nodes`): the files a real machine of its size would
have, in memory, through the agent's own builder (agent.topology.build_report), so the bridge gets what a real agent
of such a node would send.

The machine it describes: its logical CPUs over one socket (fewer than 16, or not a multiple of 4) or two, two
hyper-threads per core when the count is even, numbered as Linux numbers a two-socket Intel machine (the first
threads of every core of socket 0, then of socket 1, then the siblings in the same order); one NUMA node per socket
sharing the node's memory (its MemTotal) evenly; no huge pages; no intel_pstate or cpufreq directory (turbo off, as a
virtual machine reports it); a CPU model that says it is simulated; and no kubelet CPU manager state file (policy
`none`: the simulated pods have no exclusive CPUs). Pure and deterministic.
"""

from __future__ import annotations

from typing import Final

from agent import topology
from agent.suppress import Cpu, format_cpuset
from schemas.node_topology import NodeTopologyReported

SIMULATED_CPU_MODEL: Final = "koordbus simulated CPU @ 2.50GHz"
_LAYOUT: Final = topology.Layout(sys_root="/sys", proc_root="/proc", kubelet_root_dir="/var/lib/kubelet")


def simulated_cpus(logical: int) -> list[Cpu]:
    """The logical CPUs of the machine described above, by id."""
    sockets = 2 if logical >= 16 and logical % 4 == 0 else 1
    threads = 2 if logical % 2 == 0 else 1
    cores = logical // (sockets * threads)
    cpus = [
        Cpu(id=thread * sockets * cores + socket * cores + core, core=core, socket=socket, numa=socket)
        for thread in range(threads)
        for socket in range(sockets)
        for core in range(cores)
    ]
    return sorted(cpus, key=lambda c: c.id)


def simulated_files(cpus: list[Cpu], memory_bytes: int) -> tuple[list[int], dict[str, bytes | topology.Unreadable]]:
    """(NUMA node ids, path → content) of the machine's sysfs and procfs files the report reads."""
    nodes = sorted({c.numa for c in cpus})
    total_kb = memory_bytes // 1024
    files: dict[str, bytes | topology.Unreadable] = {
        _LAYOUT.cpuinfo: b"".join(
            f"processor\t: {c.id}\nvendor_id\t: GenuineIntel\nmodel name\t: {SIMULATED_CPU_MODEL}\n\n".encode()
            for c in cpus
        )
    }
    for i, n in enumerate(nodes):
        kb = total_kb // len(nodes) + (total_kb % len(nodes) if i == len(nodes) - 1 else 0)
        files[_LAYOUT.node_file(n, "cpulist")] = f"{format_cpuset(c.id for c in cpus if c.numa == n)}\n".encode()
        files[_LAYOUT.node_file(n, "meminfo")] = f"Node {n} MemTotal:       {kb} kB\nNode {n} MemFree: 0 kB\n".encode()
        for pool, _ in topology.HUGEPAGE_POOLS:
            files[_LAYOUT.hugepages(n, pool)] = b"0\n"
    return nodes, files


def simulated_topology(node: str, *, cpu_cores: float, memory_bytes: int, at: float) -> NodeTopologyReported:
    """The report of a simulated node of `cpu_cores` logical CPUs and `memory_bytes` of memory, read at `at`."""
    cpus = simulated_cpus(max(round(cpu_cores), 1))
    node_ids, files = simulated_files(cpus, memory_bytes)
    return topology.build_report(node=node, at=at, layout=_LAYOUT, cpus=cpus, node_ids=node_ids, files=files)
