"""The node's logical CPUs and their topology (core, socket, NUMA node) from sysfs, for the cpuset suppress policy.

Reads `<sys_root>/devices/system/cpu/online`, each online CPU's `topology/core_id` and `topology/physical_package_id`,
and `<sys_root>/devices/system/node/node*/cpulist`. A CPU whose topology files are missing counts as its own core
on socket 0; a machine without NUMA directories is one NUMA node. OSError / ValueError when `online` is unreadable.
"""

from __future__ import annotations

import os

from agent.suppress import Cpu, parse_cpuset


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


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
