"""Reads procfs and cgroupfs for the node agent and returns plain readings (agent.core types); decides nothing.

Called by agent/service.py once per collect interval (through `Collector`) and by the integration tests on
generated trees. Every directory name that becomes part of a path is checked by agent.core's parsers,
symlinks are never followed below the kubepods directory, the kubepods directory itself must resolve
inside the configured cgroup root, and a cgroup that vanishes while it is being read is skipped. On cgroup v1
kernels with kidled (Alibaba Cloud Linux) the root memory cgroup's `memory.idle_page_stats` adds a cold-page count;
elsewhere, or when that file cannot be read or parsed, the reading simply has none.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TypeVar

from agent import core, kidled
from agent.files import pread_all
from agent.settings import AgentSettings
from schemas import vocab

_V1_CPU_HIERARCHIES = ("cpuacct", "cpu,cpuacct", "cpuacct,cpu")
_V1_MEMORY_FIELDS = {
    "total_inactive_anon": "inactive_anon",
    "total_active_anon": "active_anon",
    "total_unevictable": "unevictable",
    "total_active_file": "active_file",
    "total_inactive_file": "inactive_file",
}
_V2_MEMORY_FIELDS = {name: name for name in _V1_MEMORY_FIELDS.values()}
_MEMORY_FIELD_BY_KEY = {
    version: {key.encode(): field for key, field in fields.items()}
    for version, fields in ((1, _V1_MEMORY_FIELDS), (2, _V2_MEMORY_FIELDS))
}
_MEMORY_LINE = {
    version: re.compile(rb"^(" + b"|".join(re.escape(key) for key in keys) + rb") (\d+)$", re.MULTILINE)
    for version, keys in _MEMORY_FIELD_BY_KEY.items()
}
"""The memory.stat lines we read (5 of ~40), found in one scan of the file's bytes."""
_IDLE_PAGE_STATS = "memory.idle_page_stats"
_T = TypeVar("_T")
CONTAINER_RELIST_COLLECTIONS = 5
"""A pod's container directories are listed again every this many collections (5 s at the default interval)."""

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class CgroupLayout:
    """Where pod cgroups live on this node. `driver` is "" and the bases None until kubepods exists."""

    version: int
    driver: str
    cpu_base: str | None
    memory_base: str | None


def _read_bytes(path: str) -> bytes:
    # O_NOFOLLOW: a planted symlink in a pod directory must not make us read an arbitrary file. Plain os.read:
    # a collection reads ~6 files per pod every second, and the io module's buffered text layer costs more than
    # the read itself. A directory opens fine and fails here with EISDIR.
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        chunks = []
        while chunk := os.read(fd, 65536):
            chunks.append(chunk)
    except OSError as e:
        raise OSError(e.errno, e.strerror, path) from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _read_text(path: str) -> str:
    return _read_bytes(path).decode()


def keyed_ints(text: str) -> Iterator[tuple[str, int]]:
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1].lstrip("-").isdigit():
            yield parts[0].rstrip(":"), int(parts[1])


# --- procfs


def read_proc_stat(proc_root: str) -> tuple[core.CpuTicks, int]:
    """The aggregate `cpu` line of /proc/stat and the number of `cpuN` lines (online CPUs)."""
    ticks: core.CpuTicks | None = None
    cpus = 0
    for line in _read_text(os.path.join(proc_root, "stat")).splitlines():
        if line.startswith("cpu "):
            values = [int(v) for v in line.split()[1:9]]
            values += [0] * (8 - len(values))
            user, nice, system, idle, iowait, irq, softirq, steal = values
            ticks = core.CpuTicks(
                user=user, nice=nice, system=system, idle=idle, iowait=iowait, irq=irq, softirq=softirq, steal=steal
            )
        elif line.startswith("cpu") and line[3:4].isdigit():
            cpus += 1
    if ticks is None:
        raise ValueError(f"no aggregate cpu line in {proc_root}/stat")
    return ticks, max(cpus, 1)


def read_meminfo(proc_root: str) -> core.MemInfo:
    fields = dict(keyed_ints(_read_text(os.path.join(proc_root, "meminfo"))))
    return core.MemInfo(
        total_kb=fields["MemTotal"],
        free_kb=fields["MemFree"],
        available_kb=fields.get("MemAvailable", fields["MemFree"]),
    )


def clock_ticks_per_second() -> int:
    return int(os.sysconf("SC_CLK_TCK"))


# --- layout


def detect_version(settings: AgentSettings) -> int:
    if settings.cgroup_version != "auto":
        return settings.cgroup_version
    root = settings.cgroup_root
    has_v1 = any(os.path.isdir(os.path.join(root, h)) for h in _V1_CPU_HIERARCHIES)
    return 2 if os.path.exists(os.path.join(root, "cgroup.controllers")) and not has_v1 else 1


def _hierarchy(root: str, version: int, controller: str) -> str:
    if version == 2:
        return root
    if controller == "memory":
        return os.path.join(root, "memory")
    for name in _V1_CPU_HIERARCHIES:
        path = os.path.join(root, name)
        if os.path.isdir(path):
            return path
    return os.path.join(root, "cpuacct")


def _inside(path: str, root: str) -> bool:
    real_root = os.path.realpath(root)
    return os.path.realpath(path).startswith(real_root.rstrip("/") + "/")


def detect_layout(settings: AgentSettings) -> CgroupLayout:
    """The cgroup version, the kubelet's driver and the kubepods directories of the cpu and memory hierarchies."""
    version = detect_version(settings)
    parent = core.validate_parent(settings.kubepods_parent)
    cpu_hier = _hierarchy(settings.cgroup_root, version, "cpu")
    mem_hier = _hierarchy(settings.cgroup_root, version, "memory")
    drivers: tuple[core.Driver, ...] = (
        ("cgroupfs", "systemd") if settings.cgroup_driver == "auto" else (settings.cgroup_driver,)
    )
    for driver in drivers:
        rel = os.path.join(parent, core.KUBEPODS_DIR[driver])
        cpu_base, mem_base = os.path.join(cpu_hier, rel), os.path.join(mem_hier, rel)
        inside = _inside(cpu_base, settings.cgroup_root) and _inside(mem_base, settings.cgroup_root)
        if os.path.isdir(cpu_base) and inside:
            return CgroupLayout(version=version, driver=driver, cpu_base=cpu_base, memory_base=mem_base)
    return CgroupLayout(version=version, driver="", cpu_base=None, memory_base=None)


# --- cgroups


def _subdirs(path: str, parse: Callable[[str], _T | None]) -> list[tuple[str, _T]]:
    """(name, parsed) of the subdirectories of `path` whose name `parse` accepts, sorted by name. The name is looked
    at first: a cgroup directory holds dozens of control files and only a few subdirectories."""
    out: list[tuple[str, _T]] = []
    try:
        with os.scandir(path) as it:
            for entry in it:
                parsed = parse(entry.name)
                if parsed is not None and entry.is_dir(follow_symlinks=False):
                    out.append((entry.name, parsed))
    except (FileNotFoundError, NotADirectoryError):
        return []
    out.sort(key=lambda item: item[0])
    return out


def _pod_dirs(base: str, driver: core.Driver) -> Iterator[tuple[str, str, str]]:
    """(relative path, uid, kube QoS) of every pod cgroup under kubepods."""
    for kube_qos in (vocab.KUBE_QOS_GUARANTEED, vocab.KUBE_QOS_BURSTABLE, vocab.KUBE_QOS_BESTEFFORT):
        qos_rel = core.qos_dir(driver, kube_qos)
        for name, parsed in _subdirs(os.path.join(base, qos_rel), lambda n: core.parse_pod_dir(n, driver)):
            # For systemd the QoS is in the slice name too; a pod slice in the wrong parent is not ours to read.
            if driver == "systemd" and parsed[1] != kube_qos:
                continue
            yield os.path.join(qos_rel, name), parsed[0], kube_qos


class OpenFiles:
    """Keeps the files a collection reads open until the next one and re-reads them with one pread at offset 0
    (a cgroup file regenerates its content on every read from the start): one syscall per file and collection
    instead of open, read and close. A file not read during a collection is closed by `sweep` (its cgroup is gone);
    one that fails to read is closed and opened again once (a cgroup removed and created again under the same
    path). Past `max_open` files it falls back to open-read-close, so the agent never runs out of descriptors."""

    def __init__(self, *, max_open: int | None = None) -> None:
        self.max_open = max_open if max_open is not None else descriptor_budget()
        self._fds: dict[str, int] = {}
        self._used: set[str] = set()

    def read(self, path: str) -> bytes:
        self._used.add(path)
        fd = self._fds.get(path)
        if fd is None:
            if len(self._fds) >= self.max_open:
                return _read_bytes(path)
            fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            return pread_all(fd)
        except OSError:
            self._close(path)
            fd = self._fds[path] = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                return pread_all(fd)
            except OSError as e:
                self._close(path)
                raise OSError(e.errno, e.strerror, path) from None

    def sweep(self) -> None:
        for path in [p for p in self._fds if p not in self._used]:
            self._close(path)
        self._used.clear()

    def _close(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None:
            with contextlib.suppress(OSError):  # already invalid: what made the read fail
                os.close(fd)

    def close(self) -> None:
        for path in list(self._fds):
            self._close(path)

    def __del__(self) -> None:
        self.close()


def descriptor_budget(*, share: int = 2, cap: int = 4096) -> int:
    """How many files one cache may keep open: 1/`share` of the process's descriptor limit (the collector's
    OpenFiles a half, the QoS loops' RootedFiles a quarter), which is first raised to its hard limit where that is
    allowed (as Go programs do at start; a DaemonSet usually gets a high hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard, 65536) if hard != resource.RLIM_INFINITY else 65536
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    limit = cap if soft == resource.RLIM_INFINITY else soft
    return max(0, min(cap, limit // share - 64))


Reader = Callable[[str], bytes]
"""A file's content as bytes: the counters are ASCII numbers that int() reads from bytes as well."""


def _read_cpu_ns(cgroup_dir: str, version: int, read: Reader) -> int:
    if version == 1:
        return int(read(f"{cgroup_dir}/cpuacct.usage"))
    stat = dict(keyed_ints(read(f"{cgroup_dir}/cpu.stat").decode()))
    return stat["usage_usec"] * 1000


def _read_memory(cgroup_dir: str, version: int, read: Reader) -> core.MemoryStat:
    names: Mapping[bytes, str] = _MEMORY_FIELD_BY_KEY[version]
    data = read(f"{cgroup_dir}/memory.stat")
    return core.MemoryStat(**{names[key]: int(value) for key, value in _MEMORY_LINE[version].findall(data)})


def read_cgroup(layout: CgroupLayout, rel: str, read: Reader = _read_bytes) -> core.CgroupReading | None:
    """CPU and memory counters of one cgroup, or None if it vanished (or lost a file) while being read."""
    assert layout.cpu_base is not None and layout.memory_base is not None
    try:
        return core.CgroupReading(
            cpu_usage_ns=_read_cpu_ns(f"{layout.cpu_base}/{rel}", layout.version, read),
            memory=_read_memory(f"{layout.memory_base}/{rel}", layout.version, read),
        )
    except (OSError, KeyError, ValueError):
        return None


class ContainerListings:
    """Each pod's container directories, listed again every `every` collections rather than every second: listing a
    pod directory walks its dozens of control files and was 40% of a collection. A container that appears is
    sampled from the next listing on (within `every` collections); one that cannot be read any more (it stopped)
    makes its pod's directory be listed again at the next collection."""

    def __init__(self, every: int) -> None:
        self.every = every
        self._collection = 0
        self._listed: dict[str, tuple[int, list[tuple[str, str]]]] = {}

    def begin(self) -> None:
        self._collection += 1

    def containers(self, pod_dir: str, driver: core.Driver) -> list[tuple[str, str]]:
        entry = self._listed.get(pod_dir)
        if entry is None or self._collection - entry[0] >= self.every:
            entry = (self._collection, _subdirs(pod_dir, lambda n: core.parse_container_dir(n, driver)))
            self._listed[pod_dir] = entry
        return entry[1]

    def forget(self, pod_dir: str) -> None:
        self._listed.pop(pod_dir, None)

    def keep_only(self, pod_dirs: set[str]) -> None:
        self._listed = {k: v for k, v in self._listed.items() if k in pod_dirs}


def read_pods(
    layout: CgroupLayout, read: Reader = _read_bytes, listings: ContainerListings | None = None
) -> tuple[core.PodReading, ...]:
    """Every pod cgroup under kubepods with its containers' (`listings`: container directories listed every few
    collections; None: every time)."""
    if layout.cpu_base is None or layout.driver not in ("cgroupfs", "systemd"):
        return ()
    driver: core.Driver = "systemd" if layout.driver == "systemd" else "cgroupfs"
    pods: list[core.PodReading] = []
    seen: set[str] = set()
    for rel, uid, kube_qos in _pod_dirs(layout.cpu_base, driver):
        pod_cgroup = read_cgroup(layout, rel, read)
        if pod_cgroup is None:
            continue
        pod_dir = f"{layout.cpu_base}/{rel}"
        seen.add(pod_dir)
        listed = (
            listings.containers(pod_dir, driver)
            if listings is not None
            else _subdirs(pod_dir, lambda n: core.parse_container_dir(n, driver))
        )
        containers: list[core.ContainerReading] = []
        for name, cid in listed:
            c_cgroup = read_cgroup(layout, f"{rel}/{name}", read)
            if c_cgroup is not None:
                containers.append(core.ContainerReading(container_id=cid, cgroup=c_cgroup))
            elif listings is not None:
                listings.forget(pod_dir)
        pods.append(core.PodReading(uid=uid, kube_qos=kube_qos, cgroup=pod_cgroup, containers=tuple(containers)))
    if listings is not None:
        listings.keep_only(seen)
    return tuple(pods)


# --- kidled (cgroup v1 only)


def read_cold_page_bytes(cgroup_root: str, version: int) -> int | None:
    """Cold page cache bytes of the root memory cgroup, or None when there is none to read.

    None on cgroup v2 (kidled exists only for v1, as in koordlet) and when the file is absent (every kernel
    without kidled). A file that cannot be read or parsed raises OSError / ValueError for the caller to log.
    """
    if version != 1:
        return None
    path = os.path.join(_hierarchy(cgroup_root, version, "memory"), _IDLE_PAGE_STATS)
    try:
        text = _read_text(path)
    except FileNotFoundError:
        return None
    return kidled.cold_page_bytes(kidled.parse_idle_page_stats(text))


class Collector:
    """One call = one full reading of the node. The layout is re-detected each time (a few stat calls) so an
    agent started before the kubelet picks pods up once kubepods appears. The cgroup files stay open between calls
    (OpenFiles); `close()` closes them."""

    def __init__(self, settings: AgentSettings) -> None:
        self.settings = settings
        self._ticks_per_second = clock_ticks_per_second()
        self._kidled_error = ""
        self._files = OpenFiles()
        self._listings = ContainerListings(CONTAINER_RELIST_COLLECTIONS)

    def __call__(self, now: float) -> core.NodeReading:
        layout = detect_layout(self.settings)
        cpu, cpu_count = read_proc_stat(self.settings.proc_root)
        return core.NodeReading(
            at=now,
            clock_ticks_per_second=self._ticks_per_second,
            cpu_count=cpu_count,
            cpu=cpu,
            memory=read_meminfo(self.settings.proc_root),
            cgroup_version=layout.version,
            cgroup_driver=layout.driver,
            pods=self._read_pods(layout),
            cold_page_bytes=self._cold_page_bytes(layout.version),
        )

    def _read_pods(self, layout: CgroupLayout) -> tuple[core.PodReading, ...]:
        self._listings.begin()
        try:
            return read_pods(layout, self._files.read, self._listings)
        finally:
            self._files.sweep()

    def close(self) -> None:
        self._files.close()

    def _cold_page_bytes(self, version: int) -> int | None:
        """A broken idle_page_stats costs the hot-page sample of this tick, never the whole reading; the
        error is logged when it first appears or changes, not every second."""
        try:
            cold = read_cold_page_bytes(self.settings.cgroup_root, version)
        except (OSError, ValueError) as e:
            if str(e) != self._kidled_error:
                log.warning("node %s: no hot-page memory this tick: %s", self.settings.node_name, e)
            self._kidled_error = str(e)
            return None
        self._kidled_error = ""
        return cold
