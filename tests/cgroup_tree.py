"""Test helper: writes a fake /proc (stat, meminfo) and a fake kubepods cgroup tree (v1 or v2, cgroupfs or
systemd) whose counters tests advance between two collections, optionally with host applications' cgroups outside
kubepods and a kidled `memory.idle_page_stats` in the root memory cgroup. Used by
tests/integration/test_agent_collect.py, test_agent_hostapps.py and test_agent_kidled.py; the path-name helpers are
also used to lay out the private subtree on the real cgroup filesystem.
"""

from __future__ import annotations

import itertools
import shutil
from dataclasses import dataclass, field
from pathlib import Path

MiB = 1024 * 1024
_QOS_NAMES = {"Guaranteed": "", "Burstable": "burstable", "BestEffort": "besteffort"}
KIDLED_ROWS: tuple[str, ...] = ("csei", "dsei", "cfei", "dfei", "csui", "dsui", "cfui", "dfui")
KIDLED_ROWS += ("csea", "dsea", "cfea", "dfea", "csua", "dsua", "cfua", "dfua", "slab")
KIDLED_BUCKETS = (1, 2, 5, 15, 30, 60, 120, 240)


def render_idle_page_stats(rows: dict[str, list[int]], buckets: tuple[int, ...] = KIDLED_BUCKETS) -> str:
    """A kidled `memory.idle_page_stats` laid out as the kernel prints it; rows not given are all zeros."""
    titles = [f"[{lo},{hi})" for lo, hi in itertools.pairwise(buckets)] + [f"[{buckets[-1]},+inf)"]
    header = [
        "# version: 1.0",
        "# page_scans: 24",
        "# slab_scans: 0",
        "# scan_period_in_seconds: 120",
        "# use_hierarchy: 1",
        f"# buckets: {','.join(map(str, buckets))}",
        "#",
        "#   _-----=> clean/dirty",
        "#  / _----=> swap/file",
        "# | / _---=> evict/unevict",
        "# || / _--=> inactive/active",
        "# ||| / _-=> slab",
        "# |||| /",
        "# |||||      " + "".join(f"{t:>15}" for t in titles),
    ]
    body = [f"  {name}   " + "".join(f"{v:>15}" for v in rows.get(name, [0] * len(buckets))) for name in KIDLED_ROWS]
    return "\n".join(header + body) + "\n"


def pod_rel(driver: str, uid: str, kube_qos: str) -> str:
    """The pod cgroup's path relative to the hierarchy's kubepods parent, as the kubelet lays it out."""
    qos = _QOS_NAMES[kube_qos]
    if driver == "cgroupfs":
        return "/".join(p for p in ("kubepods", qos, f"pod{uid}") if p)
    slice_uid = uid.replace("-", "_")
    if not qos:
        return f"kubepods.slice/kubepods-pod{slice_uid}.slice"
    return f"kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{slice_uid}.slice"


def container_name(driver: str, container_id: str, runtime: str = "cri-containerd") -> str:
    return container_id if driver == "cgroupfs" else f"{runtime}-{container_id}.scope"


@dataclass
class FakeCgroup:
    cpu_ns: int = 0
    inactive_anon: int = 0
    active_anon: int = 0
    unevictable: int = 0
    active_file: int = 0
    inactive_file: int = 0
    extra_usage: int = 0
    """Charged to memory.usage_in_bytes / memory.current beyond the five memory.stat fields (kernel memory …)."""

    @property
    def memory_usage(self) -> int:
        """memory.usage_in_bytes (v1) / memory.current (v2)."""
        return (
            self.inactive_anon
            + self.active_anon
            + self.unevictable
            + self.active_file
            + self.inactive_file
            + (self.extra_usage)
        )


@dataclass
class FakeProc:
    user: int = 1000
    nice: int = 0
    system: int = 500
    idle: int = 100_000
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0
    cpus: int = 4
    mem_total_kb: int = 16 * 1024 * 1024
    mem_free_kb: int = 8 * 1024 * 1024
    mem_available_kb: int = 10 * 1024 * 1024


@dataclass
class FakeCgroupTree:
    """A node on disk under `root`: call `write()` after changing `proc` or any cgroup's counters."""

    root: Path
    version: int
    driver: str
    parent: str = ""
    runtime: str = "cri-containerd"
    proc: FakeProc = field(default_factory=FakeProc)
    cgroups: dict[str, FakeCgroup] = field(default_factory=dict)
    """Relative cgroup path (under the kubepods parent) → counters."""
    host_cgroups: dict[str, FakeCgroup] = field(default_factory=dict)
    """Cgroup path relative to each hierarchy's root (not under the kubepods parent) → counters: host applications
    outside kubepods."""
    idle_page_stats: str | None = None
    """Text of the root memory cgroup's kidled `memory.idle_page_stats` (v1: <root>/memory/, v2: <root>/);
    None writes no such file (and removes one an earlier write left)."""

    @property
    def proc_root(self) -> Path:
        return self.root / "proc"

    @property
    def cgroup_root(self) -> Path:
        return self.root / "cgroup"

    def hierarchies(self) -> list[Path]:
        base = self.cgroup_root
        return [base] if self.version == 2 else [base / "cpu", base / "cpuacct", base / "memory"]

    def add_pod(self, uid: str, kube_qos: str, **counters: int) -> FakeCgroup:
        cg = self.cgroups[pod_rel(self.driver, uid, kube_qos)] = FakeCgroup(**counters)
        return cg

    def add_container(self, uid: str, kube_qos: str, container_id: str, **counters: int) -> FakeCgroup:
        rel = f"{pod_rel(self.driver, uid, kube_qos)}/{container_name(self.driver, container_id, self.runtime)}"
        cg = self.cgroups[rel] = FakeCgroup(**counters)
        return cg

    def add_host_cgroup(self, rel: str, **counters: int) -> FakeCgroup:
        """A cgroup outside kubepods, `rel` from each hierarchy's root (a host application's)."""
        cg = self.host_cgroups[rel] = FakeCgroup(**counters)
        return cg

    def kubepods_rel(self, kube_qos: str) -> str:
        """The directory of a QoS class's pods, relative to the kubepods parent."""
        qos = _QOS_NAMES[kube_qos]
        if self.driver == "cgroupfs":
            return "/".join(p for p in ("kubepods", qos) if p)
        return f"kubepods.slice/kubepods-{qos}.slice" if qos else "kubepods.slice"

    def remove(self, rel_prefix: str) -> None:
        """Forget (and delete on the next write) every cgroup at or below `rel_prefix`."""
        for rel in [r for r in self.cgroups if r == rel_prefix or r.startswith(rel_prefix + "/")]:
            del self.cgroups[rel]
        for hier in self.hierarchies():
            shutil.rmtree(hier / self.parent / rel_prefix, ignore_errors=True)

    def write(self) -> None:
        self._write_proc()
        self.cgroup_root.mkdir(parents=True, exist_ok=True)
        if self.version == 2:
            (self.cgroup_root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
        for rel, cg in self.cgroups.items():
            self._write_cgroup(f"{self.parent}/{rel}" if self.parent else rel, cg)
        for rel, cg in self.host_cgroups.items():
            self._write_cgroup(rel, cg)
        self._write_idle_page_stats()

    def _write_idle_page_stats(self) -> None:
        memory_root = self.cgroup_root if self.version == 2 else self.cgroup_root / "memory"
        path = memory_root / "memory.idle_page_stats"
        if self.idle_page_stats is None:
            path.unlink(missing_ok=True)
            return
        memory_root.mkdir(parents=True, exist_ok=True)
        path.write_text(self.idle_page_stats)

    def _write_proc(self) -> None:
        p = self.proc
        self.proc_root.mkdir(parents=True, exist_ok=True)
        fields = [p.user, p.nice, p.system, p.idle, p.iowait, p.irq, p.softirq, p.steal, 0, 0]
        lines = ["cpu  " + " ".join(map(str, fields))]
        lines += [f"cpu{i} 0 0 0 0 0 0 0 0 0 0" for i in range(p.cpus)]
        lines += ["intr 12345 0 0", "ctxt 999", "btime 1700000000", "processes 42"]
        (self.proc_root / "stat").write_text("\n".join(lines) + "\n")
        (self.proc_root / "meminfo").write_text(
            f"MemTotal:       {p.mem_total_kb} kB\nMemFree:        {p.mem_free_kb} kB\n"
            f"MemAvailable:   {p.mem_available_kb} kB\nBuffers:          1024 kB\nCached:         2048 kB\n"
        )

    def _write_cgroup(self, rel: str, cg: FakeCgroup) -> None:
        """`rel` from each hierarchy's root."""
        memory = {
            "inactive_anon": cg.inactive_anon,
            "active_anon": cg.active_anon,
            "inactive_file": cg.inactive_file,
            "active_file": cg.active_file,
            "unevictable": cg.unevictable,
        }
        if self.version == 2:
            d = self.cgroup_root / rel
            d.mkdir(parents=True, exist_ok=True)
            usec = cg.cpu_ns // 1000
            (d / "cpu.stat").write_text(f"usage_usec {usec}\nuser_usec {usec // 2}\nsystem_usec {usec - usec // 2}\n")
            stat = {"anon": cg.inactive_anon + cg.active_anon, "file": cg.active_file + cg.inactive_file, **memory}
            (d / "memory.stat").write_text("".join(f"{k} {v}\n" for k, v in stat.items()))
            (d / "memory.current").write_text(f"{cg.memory_usage}\n")
            return
        for hier in ("cpu", "cpuacct", "memory"):
            (self.cgroup_root / hier / rel).mkdir(parents=True, exist_ok=True)
        (self.cgroup_root / "cpuacct" / rel / "cpuacct.usage").write_text(f"{cg.cpu_ns}\n")
        # v1 memory.stat: local fields (which the agent must ignore) first, hierarchical total_* fields after.
        local = "".join(f"{k} 7\n" for k in memory)
        total = "".join(f"total_{k} {v}\n" for k, v in memory.items())
        (self.cgroup_root / "memory" / rel / "memory.stat").write_text(
            f"cache 0\nrss 0\n{local}hierarchical_memory_limit 9223372036854771712\n{total}"
        )
        (self.cgroup_root / "memory" / rel / "memory.usage_in_bytes").write_text(f"{cg.memory_usage}\n")
