"""Per-NUMA-node usage for the NodeMetric's `numaUsages` (spec §1.4): pure parsing and arithmetic.

A NUMA node's CPU usage is the busy ticks of its CPUs (the `cpuN` lines of /proc/stat, grouped by each node's
`cpulist`) over the wall time, in cores; its memory is MemTotal − (MemFree + Active(file) + Inactive(file) +
SReclaimable) of `/sys/devices/system/node/nodeN/meminfo` (which has no MemAvailable, so it can differ slightly from
the node-level MemTotal − MemAvailable), at least 0. Its system usage, as the CRD describes it: memory is its usage
less what the pods hold on it (their `memory.numa_stat`: v1 `hierarchical_total` pages, v2 anon + file +
unevictable bytes), host applications not excluded; CPU is the node's system CPU apportioned by the NUMA nodes'
shares of the CPU usage.

Called by agent.collect (the reading) and agent.core.Sampler (the samples). A machine without NUMA directories in
sysfs reports no NUMA usage, as koordlet does.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import msgspec

_NUMA_MEMINFO_LINE = re.compile(r"^Node\s+\d+\s+([A-Za-z()_]+):\s+(\d+)", re.MULTILINE)
_FREE_FIELDS = ("MemFree", "Active(file)", "Inactive(file)", "SReclaimable")
MAX_NUMA_NODES = 1024


class NumaReading(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One NUMA node as read at one instant: the busy ticks of its CPUs and its used memory in bytes."""

    id: int
    busy_ticks: int
    memory: int


class NumaSample(msgspec.Struct, frozen=True, kw_only=True, gc=False, array_like=True):
    """One NUMA node's usage over the last interval: cores and bytes, and its system share of both."""

    id: int
    cpu: float
    memory: int
    system_cpu: float
    system_memory: int


def numa_memory_bytes(meminfo_text: str) -> int:
    """Used memory of one NUMA node from its sysfs meminfo (kB values); KeyError when MemTotal or MemFree is
    missing."""
    fields = {name: int(value) for name, value in _NUMA_MEMINFO_LINE.findall(meminfo_text)}
    total = fields["MemTotal"]
    fields["MemFree"]
    free = sum(fields.get(name, 0) for name in _FREE_FIELDS)
    return max(total - free, 0) * 1024


def numa_busy_ticks(per_cpu_busy: Mapping[int, int], cpus: Iterable[int]) -> int:
    """The busy ticks of a NUMA node's CPUs (a CPU missing from /proc/stat, being offline, counts 0)."""
    return sum(per_cpu_busy.get(cpu, 0) for cpu in cpus)


def pod_numa_bytes(numa_stat_text: str, version: int, page_size: int) -> dict[int, int]:
    """A pod cgroup's memory per NUMA node from its `memory.numa_stat`: v1 the `hierarchical_total` line in pages
    (× page size), v2 the anon, file and unevictable lines in bytes. Malformed entries are skipped."""
    wanted = ("hierarchical_total",) if version == 1 else ("anon", "file", "unevictable")
    out: dict[int, int] = {}
    for line in numa_stat_text.splitlines():
        head, _, rest = line.partition(" " if version != 1 else "=")
        if head not in wanted:
            continue
        for entry in rest.split():
            node, eq, value = entry.partition("=")
            if eq and node.startswith("N") and node[1:].isdigit() and value.isdigit():
                amount = int(value) * (page_size if version == 1 else 1)
                out[int(node[1:])] = out.get(int(node[1:]), 0) + amount
    return out


class NumaSampler:
    """Turns successive NUMA readings into samples (the first reading, and a node whose counters went back, give
    none for that node)."""

    def __init__(self) -> None:
        self._prev: dict[int, int] = {}

    def observe(
        self,
        numa: Iterable[NumaReading],
        *,
        wall_seconds: float,
        ticks_per_second: int,
        system_cpu: float | None,
        pods_on_numa: Mapping[int, int],
    ) -> tuple[NumaSample, ...]:
        readings = list(numa)
        prev, self._prev = self._prev, {r.id: r.busy_ticks for r in readings}
        if wall_seconds <= 0 or ticks_per_second <= 0:
            return ()
        cores: dict[int, float] = {}
        for r in readings:
            before = prev.get(r.id)
            if before is not None and r.busy_ticks >= before:
                cores[r.id] = (r.busy_ticks - before) / (wall_seconds * ticks_per_second)
        total = sum(cores.values())
        samples = []
        for r in sorted(readings, key=lambda r: r.id):
            if r.id not in cores:
                continue
            share = cores[r.id] / total if total > 0 else 0.0
            samples.append(
                NumaSample(
                    id=r.id,
                    cpu=cores[r.id],
                    memory=r.memory,
                    system_cpu=(system_cpu or 0.0) * share,
                    system_memory=max(r.memory - pods_on_numa.get(r.id, 0), 0),
                )
            )
        return tuple(samples)
