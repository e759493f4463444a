"""Reads procfs and cgroupfs for the node agent and returns plain readings (agent.core types); decides nothing.

Called by agent/service.py once per collect interval (through `Collector`) and by the integration tests on
generated trees. Every directory name that becomes part of a path is checked by agent.core's parsers,
symlinks are never followed below the kubepods directory, the kubepods directory itself must resolve
inside the configured cgroup root, and a cgroup that vanishes while it is being read is skipped. The NodeSLO's host
applications (agent/hostapps.py checks them) are read like pods, each from a directory that must resolve inside the
cgroup root too. On cgroup v1 kernels with kidled (Alibaba Cloud Linux) the root memory cgroup's
`memory.idle_page_stats` adds a cold-page count; elsewhere, or when that file cannot be read or parsed, the reading
simply has none. PSI (agent/psi.py) comes from `<proc_root>/pressure/{cpu,memory,io}` for the node and from each pod
cgroup's `{cpu,memory,io}.pressure` (cgroup v2, or v1 where the kernel provides them in the cpuacct hierarchy); where
those files are absent the collector says so once ("PSI not available: …") and the reading has no PSI, never zeros.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import resource
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from agent import core, cpus, hostapps, kidled, numa, psi
from agent.files import pread_all
from agent.settings import AgentSettings
from schemas import vocab
from schemas.psi import RESOURCES

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


def _cpu_ticks(fields: list[str]) -> core.CpuTicks:
    values = [int(v) for v in fields[:8]]
    values += [0] * (8 - len(values))
    user, nice, system, idle, iowait, irq, softirq, steal = values
    return core.CpuTicks(
        user=user, nice=nice, system=system, idle=idle, iowait=iowait, irq=irq, softirq=softirq, steal=steal
    )


def read_proc_stat(proc_root: str) -> tuple[core.CpuTicks, int, dict[int, int]]:
    """The aggregate `cpu` line of /proc/stat, the number of `cpuN` lines (online CPUs) and each CPU's busy
    ticks (for the NUMA nodes' usage)."""
    ticks: core.CpuTicks | None = None
    per_cpu: dict[int, int] = {}
    for line in _read_text(os.path.join(proc_root, "stat")).splitlines():
        if line.startswith("cpu "):
            ticks = _cpu_ticks(line.split()[1:9])
        elif line.startswith("cpu") and line[3:4].isdigit():
            name, *fields = line.split()
            per_cpu[int(name[3:])] = _cpu_ticks(fields).busy
    if ticks is None:
        raise ValueError(f"no aggregate cpu line in {proc_root}/stat")
    return ticks, max(len(per_cpu), 1), per_cpu


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


def perf_event_pod_dirs(settings: AgentSettings, layout: CgroupLayout) -> tuple[list[tuple[str, str]], str]:
    """(uid, directory) of every pod cgroup in the hierarchy that holds the perf_event controller, for the CPI
    counters (agent.cpi_collect), and what is wrong when there is no such hierarchy ("" otherwise, also when kubepods
    does not exist yet). On v2 that is the unified hierarchy (perf_event is always on there); on v1 the `perf_event`
    hierarchy, or, where perf_event is not mounted on v1 (a hybrid host, where it then belongs to the unified
    hierarchy), `unified` when it holds kubepods (the systemd driver's slices are there too)."""
    if layout.driver not in ("cgroupfs", "systemd") or layout.cpu_base is None:
        return [], ""
    driver: core.Driver = "systemd" if layout.driver == "systemd" else "cgroupfs"
    if layout.version == 2:
        base = layout.cpu_base
    else:
        root = settings.cgroup_root
        rel = os.path.join(core.validate_parent(settings.kubepods_parent), core.KUBEPODS_DIR[driver])
        candidates = [os.path.join(root, name) for name in ("perf_event", "unified")]
        hierarchy = next((c for c in candidates if os.path.isdir(os.path.join(c, rel))), None)
        if hierarchy is None:
            return [], (
                f"no {rel} in a perf_event hierarchy ({root}/perf_event, or {root}/unified on a hybrid host): "
                "the kernel counts perf events only for cgroups of the hierarchy that has the perf_event controller"
            )
        base = os.path.join(hierarchy, rel)
    if not _inside(base, settings.cgroup_root):
        return [], f"{base} resolves outside the cgroup root {settings.cgroup_root}"
    return [(uid, f"{base}/{pod}") for pod, uid, _qos in _pod_dirs(base, driver)], ""


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


def _read_numa_stat(cgroup_dir: str, version: int, page_size: int, read: Reader) -> dict[int, int]:
    """A cgroup's memory per NUMA node; empty when the file is missing or unreadable (no NUMA statistics)."""
    try:
        return numa.pod_numa_bytes(
            read(f"{cgroup_dir}/memory.numa_stat").decode("ascii", "replace"), version, page_size
        )
    except OSError:
        return {}


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
    layout: CgroupLayout,
    read: Reader = _read_bytes,
    listings: ContainerListings | None = None,
    *,
    numa_page_size: int | None = None,
    pressure: PodPressure | None = None,
) -> tuple[core.PodReading, ...]:
    """Every pod cgroup under kubepods with its containers' (`listings`: container directories listed every few
    collections; None: every time), with `numa_page_size` each pod's memory per NUMA node (memory.numa_stat), and
    with `pressure` each pod's PSI counters."""
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
        numa_memory: dict[int, int] = {}
        if numa_page_size is not None and layout.memory_base is not None:
            numa_memory = _read_numa_stat(f"{layout.memory_base}/{rel}", layout.version, numa_page_size, read)
        pods.append(
            core.PodReading(
                uid=uid,
                kube_qos=kube_qos,
                cgroup=pod_cgroup,
                containers=tuple(containers),
                numa_memory=numa_memory,
                psi=None if pressure is None else pressure.read(pod_dir, read),
            )
        )
    if listings is not None:
        listings.keep_only(seen)
    return tuple(pods)


# --- PSI


def read_pressure_files(
    paths: Sequence[tuple[str, str]], read: Reader = _read_bytes
) -> tuple[psi.PsiReading | None, str]:
    """The PSI counters of (resource, path) pressure files, None when not one of them could be read, and what was
    wrong with those that could not ("" when nothing was)."""
    totals: dict[str, psi.PsiTotals] = {}
    problems: list[str] = []
    for kind, path in paths:
        try:
            totals[kind] = psi.parse_pressure(read(path).decode("ascii", "replace"))
        except FileNotFoundError:
            problems.append(f"{path} does not exist")
        except OSError as e:  # EOPNOTSUPP: a kernel built with PSI but booted with psi=0
            problems.append(f"{path}: {e.strerror or e}")
        except psi.PsiParseError as e:
            problems.append(f"{path}: {e}")
    return (psi.PsiReading(**totals) if totals else None), "; ".join(problems)


def read_node_pressure(proc_root: str, read: Reader = _read_bytes) -> tuple[psi.PsiReading | None, str]:
    """The node's PSI counters from `<proc_root>/pressure/{cpu,memory,io}` (see read_pressure_files)."""
    return read_pressure_files([(r, os.path.join(proc_root, "pressure", r)) for r in RESOURCES], read)


class PressureLog:
    """Says once that PSI is not available (or only partly) for the node's or the pods' pressure (`scope`), and once
    when that changes; not every collection."""

    def __init__(self, node_name: str, scope: str) -> None:
        self._node_name = node_name
        self._scope = scope
        self._problem: str | None = None

    def note(self, reading: psi.PsiReading | None, problem: str) -> None:
        if problem == self._problem:
            return
        if reading is None:  # a kernel or cgroup layout without PSI is a fact about the node, not a fault
            log.info(
                "node %s: PSI not available: %s; no %s pressure is reported", self._node_name, problem, self._scope
            )
        elif problem:
            log.warning(
                "node %s: PSI partly available: %s; %s pressure is reported without those files",
                self._node_name,
                problem,
                self._scope,
            )
        elif self._problem is not None:
            log.info("node %s: PSI available again: %s pressure is reported", self._node_name, self._scope)
        self._problem = problem


class PodPressure:
    """Reads each pod cgroup's pressure files during one collection. When the first pod read has none, no pod has:
    the others are not tried that collection (no failing open per pod and second) and it is logged once."""

    def __init__(self, node_name: str) -> None:
        self._log = PressureLog(node_name, "pod")
        self._skip = False
        self._first = True

    def begin(self) -> None:
        self._skip, self._first = False, True

    def read(self, cgroup_dir: str, read: Reader) -> psi.PsiReading | None:
        if self._skip:
            return None
        reading, problem = read_pressure_files([(r, f"{cgroup_dir}/{r}.pressure") for r in RESOURCES], read)
        if self._first:
            self._first = False
            self._skip = reading is None
            self._log.note(reading, problem.replace(cgroup_dir, "<pod cgroup>"))
        return reading


# --- host applications (spec §1.4)

_MEMORY_USAGE_FILE = {1: "memory.usage_in_bytes", 2: "memory.current"}


def read_host_app(
    app: hostapps.HostApp,
    *,
    cgroup_root: str,
    version: int,
    driver: str,
    kubepods_parent: str,
    read: Reader = _read_bytes,
) -> core.HostAppReading | str:
    """One host application's cgroup counters, or why they cannot be read this time (its base is a kubepods
    directory not found yet, its directory resolves outside the cgroup root, or a file is missing or malformed)."""
    rel = hostapps.cgroup_dir(app, driver=driver, kubepods_parent=kubepods_parent)
    if rel is None:
        return "its base is a kubepods directory and kubepods is not there (yet)"
    cpu_dir = os.path.join(_hierarchy(cgroup_root, version, "cpu"), rel)
    memory_dir = os.path.join(_hierarchy(cgroup_root, version, "memory"), rel)
    if not (_inside(cpu_dir, cgroup_root) and _inside(memory_dir, cgroup_root)):
        return f"its cgroup {rel} resolves outside the cgroup root {cgroup_root}"
    try:
        return core.HostAppReading(
            name=app.name,
            priority=app.priority,
            qos=app.qos,
            cgroup_dir=rel,
            cgroup=core.CgroupReading(
                cpu_usage_ns=_read_cpu_ns(cpu_dir, version, read), memory=_read_memory(memory_dir, version, read)
            ),
            memory_usage=int(read(f"{memory_dir}/{_MEMORY_USAGE_FILE[version]}")),
        )
    except (OSError, KeyError, ValueError) as e:
        what = f"no {e} line" if isinstance(e, KeyError) else str(e)
        return f"its cgroup {rel} cannot be read: {what}"


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
    (OpenFiles); `close()` closes them.

    `host_applications` gives the `hostApplications` of the NodeSLO in effect (None: none); they are checked again
    when it changes (agent/hostapps.py), each entry skipped is logged with its reason once, and an application whose
    cgroup cannot be read is logged when that starts or its reason changes, and when it is readable again."""

    def __init__(self, settings: AgentSettings, *, host_applications: Callable[[], object] | None = None) -> None:
        self.settings = settings
        self._ticks_per_second = clock_ticks_per_second()
        self._kidled_error = ""
        self._files = OpenFiles()
        self._listings = ContainerListings(CONTAINER_RELIST_COLLECTIONS)
        self._numa = cpus.NumaNodes(settings.sys_root, settings.node_name)
        self._page_size = os.sysconf("SC_PAGE_SIZE")
        self._host_applications = host_applications
        self._host_apps_raw: object = None
        self._host_apps: tuple[hostapps.HostApp, ...] = ()
        self._host_app_problems: dict[str, str] = {}
        self._node_pressure_log = PressureLog(settings.node_name, "node")
        self._pod_pressure = PodPressure(settings.node_name)

    def __call__(self, now: float) -> core.NodeReading:
        layout = detect_layout(self.settings)
        cpu, cpu_count, per_cpu_busy = read_proc_stat(self.settings.proc_root)
        pods, apps = self._read_cgroups(layout)
        return core.NodeReading(
            at=now,
            clock_ticks_per_second=self._ticks_per_second,
            cpu_count=cpu_count,
            cpu=cpu,
            memory=read_meminfo(self.settings.proc_root),
            cgroup_version=layout.version,
            cgroup_driver=layout.driver,
            pods=pods,
            cold_page_bytes=self._cold_page_bytes(layout.version),
            numa=self._numa.read(per_cpu_busy),
            host_apps=apps,
            psi=self._node_pressure(),
        )

    def _node_pressure(self) -> psi.PsiReading | None:
        reading, problem = read_node_pressure(self.settings.proc_root)
        self._node_pressure_log.note(reading, problem)
        return reading

    def _read_cgroups(
        self, layout: CgroupLayout
    ) -> tuple[tuple[core.PodReading, ...], tuple[core.HostAppReading, ...]]:
        self._listings.begin()
        self._pod_pressure.begin()
        try:
            page_size = self._page_size if self._numa.present else None
            pods = read_pods(
                layout, self._files.read, self._listings, numa_page_size=page_size, pressure=self._pod_pressure
            )
            return pods, self._read_host_apps(layout)
        finally:
            self._files.sweep()

    @property
    def host_apps(self) -> tuple[hostapps.HostApp, ...]:
        """The host applications measured (the NodeSLO's, less the entries skipped)."""
        return self._host_apps

    def _read_host_apps(self, layout: CgroupLayout) -> tuple[core.HostAppReading, ...]:
        self._take_host_apps()
        readings: list[core.HostAppReading] = []
        problems: dict[str, str] = {}
        for app in self._host_apps:
            got = read_host_app(
                app,
                cgroup_root=self.settings.cgroup_root,
                version=layout.version,
                driver=layout.driver,
                kubepods_parent=self.settings.kubepods_parent,
                read=self._files.read,
            )
            if isinstance(got, str):
                problems[app.name] = got
            else:
                readings.append(got)
        node = self.settings.node_name
        for name, problem in problems.items():
            if self._host_app_problems.get(name) != problem:
                log.warning("node %s: host application %s not measured this time: %s", node, name, problem)
        for name in self._host_app_problems.keys() - problems.keys():
            if any(app.name == name for app in self._host_apps):
                log.info("node %s: host application %s is measured again", node, name)
        self._host_app_problems = problems
        return tuple(readings)

    def _take_host_apps(self) -> None:
        """Check the NodeSLO's hostApplications again when they changed (the spec in effect is replaced whole)."""
        raw = self._host_applications() if self._host_applications is not None else None
        if raw is self._host_apps_raw or raw == self._host_apps_raw:
            return
        self._host_apps_raw = raw
        self._host_apps, refused = hostapps.parse_host_applications(raw)
        node = self.settings.node_name
        for reason in refused:
            log.warning("node %s: host application skipped: %s", node, reason)
        log.info(
            "node %s: measuring %d host application(s)%s",
            node,
            len(self._host_apps),
            f" ({', '.join(app.name for app in self._host_apps)})" if self._host_apps else "",
        )

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
