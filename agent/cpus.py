"""The node's logical CPUs and their topology (core, socket, NUMA node) from sysfs, for the cpuset suppress policy,
and its NUMA nodes' CPUs and used memory for the NodeMetric's numaUsages (`NumaNodes`, read by agent.collect); the
online CPUs alone for the CPI counters (`online_cpus`, agent.cpi_collect).

Reads `<sys_root>/devices/system/cpu/online`, each online CPU's `topology/core_id` and `topology/physical_package_id`,
and `<sys_root>/devices/system/node/node*/cpulist`. A CPU whose topology files are missing counts as its own core
on socket 0; a machine without NUMA directories is one NUMA node. OSError / ValueError when `online` is unreadable.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from agent import numa
from agent.suppress import Cpu, parse_cpuset

log = logging.getLogger(__name__)


def _text(path: str) -> str:
    with open(path) as f:
        return f.read()


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def online_cpus(sys_root: str) -> list[int]:
    """The online CPUs' ids (`<sys_root>/devices/system/cpu/online`); OSError / ValueError when unreadable."""
    return sorted(parse_cpuset(_text(os.path.join(sys_root, "devices/system/cpu/online"))))


def read_cpus(sys_root: str) -> list[Cpu]:
    base = os.path.join(sys_root, "devices/system/cpu")
    online_text = _read(os.path.join(base, "online"))
    if online_text is None:
        raise OSError(f"cannot read {base}/online")
    numa_of: dict[int, int] = {}
    node_base = os.path.join(sys_root, "devices/system/node")
    if os.path.isdir(node_base):
        for name in os.listdir(node_base):
            if name.startswith("node") and name[4:].isdigit():
                for cpu in parse_cpuset(_read(os.path.join(node_base, name, "cpulist")) or ""):
                    numa_of[cpu] = int(name[4:])
    cpus: list[Cpu] = []
    for cpu in sorted(parse_cpuset(online_text)):
        topology = os.path.join(base, f"cpu{cpu}", "topology")
        core = _read(os.path.join(topology, "core_id"))
        socket = _read(os.path.join(topology, "physical_package_id"))
        cpus.append(
            Cpu(
                id=cpu,
                core=int(core) if core and core.lstrip("-").isdigit() else 10_000 + cpu,
                socket=int(socket) if socket and socket.lstrip("-").isdigit() else 0,
                numa=numa_of.get(cpu, 0),
            )
        )
    return cpus


class NumaNodes:
    """The machine's NUMA nodes (`<sys_root>/devices/system/node/nodeN`): their CPUs, listed once, and each
    collection their used memory. A machine without those directories has none (no numaUsages); a node whose
    files cannot be read or parsed is left out of that collection, logged when the error first appears."""

    def __init__(self, sys_root: str, node_name: str) -> None:
        self._base = os.path.join(sys_root, "devices/system/node")
        self._node_name = node_name
        self._cpus: dict[int, frozenset[int]] | None = None
        self._errors: dict[int, str] = {}

    @property
    def present(self) -> bool:
        """Whether the machine has NUMA nodes to report (listed at the first call)."""
        if self._cpus is None:
            self._cpus = self._list()
        return bool(self._cpus)

    def read(self, per_cpu_busy: Mapping[int, int]) -> tuple[numa.NumaReading, ...]:
        if self._cpus is None:
            self._cpus = self._list()
        readings = []
        for node_id, cpus in self._cpus.items():
            try:
                memory = numa.numa_memory_bytes(_text(os.path.join(self._base, f"node{node_id}", "meminfo")))
            except (OSError, KeyError, ValueError) as e:
                self._report(node_id, f"{type(e).__name__}: {e}")
                continue
            self._errors.pop(node_id, None)
            readings.append(
                numa.NumaReading(id=node_id, busy_ticks=numa.numa_busy_ticks(per_cpu_busy, cpus), memory=memory)
            )
        return tuple(readings)

    def _list(self) -> dict[int, frozenset[int]]:
        try:
            names = sorted(n for n in os.listdir(self._base) if n.startswith("node") and n[4:].isdigit())
        except OSError:
            return {}
        nodes: dict[int, frozenset[int]] = {}
        for name in names[: numa.MAX_NUMA_NODES]:
            try:
                cpulist = _text(os.path.join(self._base, name, "cpulist")).strip()
                nodes[int(name[4:])] = frozenset(parse_cpuset(cpulist))
            except (OSError, ValueError) as e:
                self._report(int(name[4:]), f"cpulist: {e}")
        return nodes

    def _report(self, node_id: int, error: str) -> None:
        if self._errors.get(node_id) != error:
            log.warning("node %s: NUMA node %d left out of numaUsages: %s", self._node_name, node_id, error)
        self._errors[node_id] = error
