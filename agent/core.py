"""Pure node-agent arithmetic: cgroup name parsing, usage formulas (spec §1.4) and sampling state.
The kidled cold-page parsing lives in agent/kidled.py, batching and the outbox in agent/batch.py.

Called by agent/collect.py (name parsing and the reading types it fills), agent/service.py (Sampler),
agent/hostapps.py and agent/settings.py (name validation). Nothing here touches files, clocks or
the event loop: every reading carries the time it was taken, so the same readings always give the
same samples and the same batches.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Final, Literal

import msgspec

from agent import kidled, numa
from agent.cpi import CpiCount
from agent.psi import PsiReading, PsiSampler
from schemas import names, vocab
from schemas.node import (
    PodRef,
    PriorityClassName,
    QoSClassName,
    Sample,
)
from schemas.psi import PsiSample

Driver = Literal["cgroupfs", "systemd"]

# Kubelet pod UIDs are RFC 4122 UUIDs, except static pods whose UID is a 32-hex-digit config hash (schemas.names).
# Every pattern here is used with fullmatch: `$` would let a trailing newline through.
_POD_UID = r"(?:[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}|[0-9a-f]{32})"
_RUNTIMES: Final = ("cri-containerd", "docker", "crio", "cri-o")
_SCOPE_RE: Final = re.compile(rf"(?:{'|'.join(map(re.escape, _RUNTIMES))})-([0-9a-f]{{8,64}})\.scope")
_QOS_DIRS: Final[Mapping[str, str]] = {
    "": vocab.KUBE_QOS_GUARANTEED,
    "burstable": vocab.KUBE_QOS_BURSTABLE,
    "besteffort": vocab.KUBE_QOS_BESTEFFORT,
}
_DIR_OF_QOS: Final[Mapping[str, str]] = {qos: name for name, qos in _QOS_DIRS.items()}
_CGROUPFS_POD_RE: Final = re.compile(rf"pod({_POD_UID})")
_SYSTEMD_POD_RE: Final = re.compile(r"kubepods-(?:(burstable|besteffort)-)?pod([0-9a-f_]{32,36})\.slice")
_PATH_COMPONENT_RE: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@-]*")

KUBEPODS_DIR: Final[Mapping[Driver, str]] = {"cgroupfs": "kubepods", "systemd": "kubepods.slice"}


class AgentNameError(ValueError):
    """A name that was about to become part of a path is not a well-formed pod UID, container ID or parent."""


# --- names in cgroup paths


def is_pod_uid(uid: str) -> bool:
    return names.is_pod_uid(uid)


def is_container_id(container_id: str) -> bool:
    return names.is_container_id(container_id)


def qos_dir(driver: Driver, kube_qos: str) -> str:
    """The directory under kubepods that holds pods of `kube_qos` ("" for Guaranteed, which sits at the top);
    AgentNameError for a QoS class Kubernetes does not have (a pod's status.qosClass is the kubelet's to set)."""
    name = _DIR_OF_QOS.get(kube_qos)
    if name is None:
        raise AgentNameError(
            f"QoS class {names.shown(kube_qos)} is none of {', '.join(_DIR_OF_QOS)}: no cgroup directory for it"
        )
    if not name or driver == "cgroupfs":
        return name
    return f"kubepods-{name}.slice"


def parse_pod_dir(name: str, driver: Driver) -> tuple[str, str] | None:
    """(uid, kube QoS) of a pod cgroup directory name, or None when the name is not a pod cgroup.

    The QoS comes from the systemd slice name; for cgroupfs it comes from the parent directory, so
    this returns Guaranteed and `collect` overrides it with the QoS of the directory it listed.
    """
    if driver == "cgroupfs":
        m = _CGROUPFS_POD_RE.fullmatch(name)
        return (m.group(1), vocab.KUBE_QOS_GUARANTEED) if m else None
    m = _SYSTEMD_POD_RE.fullmatch(name)
    if not m:
        return None
    uid = m.group(2).replace("_", "-")
    if not is_pod_uid(uid):
        return None
    return uid, _QOS_DIRS[m.group(1) or ""]


def parse_container_dir(name: str, driver: Driver) -> str | None:
    """The container ID of a container cgroup directory name, or None (sandbox helpers, conmon, files …)."""
    if driver == "cgroupfs":
        return name if is_container_id(name) else None
    m = _SCOPE_RE.fullmatch(name)
    return m.group(1) if m else None


def validate_parent(parent: str) -> str:
    """A relative cgroup parent path made only of plain components; raises AgentNameError otherwise."""
    if parent in ("", "."):
        return ""
    parts = parent.rstrip("/").split("/")
    if parent.startswith("/") or any(p in (".", "..") or not _PATH_COMPONENT_RE.fullmatch(p) for p in parts):
        raise AgentNameError(f"cgroup parent {parent!r} must be a relative path of plain names (no '..', no '/')")
    return "/".join(parts)


# --- readings (filled by agent/collect.py)


class CpuTicks(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The first `cpu` line of /proc/stat, in clock ticks."""

    user: int
    nice: int
    system: int
    idle: int
    iowait: int = 0
    irq: int = 0
    softirq: int = 0
    steal: int = 0

    @property
    def busy(self) -> int:
        """Ticks koordlet counts as used: iowait, idle and steal are not (spec §1.4)."""
        return self.user + self.nice + self.system + self.irq + self.softirq


class MemInfo(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """/proc/meminfo fields in kB."""

    total_kb: int
    free_kb: int
    available_kb: int


class MemoryStat(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """memory.stat fields in bytes (v1 `total_*` hierarchical fields, v2 plain fields)."""

    inactive_anon: int = 0
    active_anon: int = 0
    unevictable: int = 0
    active_file: int = 0
    inactive_file: int = 0


class CgroupReading(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    cpu_usage_ns: int
    memory: MemoryStat


class ContainerReading(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    container_id: str
    cgroup: CgroupReading


class PodReading(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    uid: str
    kube_qos: str
    cgroup: CgroupReading
    containers: tuple[ContainerReading, ...] = ()
    numa_memory: dict[int, int] = {}
    """The pod's memory per NUMA node in bytes (memory.numa_stat, agent.numa.pod_numa_bytes); empty if unread."""
    psi: PsiReading | None = None
    """The pod cgroup's pressure counters (agent.psi); None where its cgroup has no pressure files."""


class HostAppReading(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One NodeSLO host application's cgroup (agent/hostapps.py), as one collection read it."""

    name: str
    priority: PriorityClassName = ""
    qos: QoSClassName = ""
    cgroup_dir: str
    """Relative to each hierarchy's root; with the name, what its CPU counter is remembered by."""
    cgroup: CgroupReading
    memory_usage: int
    """memory.usage_in_bytes (v2: memory.current): Koordinator's with-page-cache variant for host applications."""


class NodeReading(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Everything one collection read, taken at `at` (unix seconds)."""

    at: float
    clock_ticks_per_second: int
    cpu_count: int
    cpu: CpuTicks
    memory: MemInfo
    cgroup_version: int = 0
    cgroup_driver: str = ""
    pods: tuple[PodReading, ...] = ()
    cold_page_bytes: int | None = None
    """Cold page cache of the root memory cgroup (kidled, cgroup v1); None where the kernel has no kidled."""
    numa: tuple[numa.NumaReading, ...] = ()
    """Each NUMA node's busy ticks and used memory; empty on a machine without NUMA nodes in sysfs."""
    host_apps: tuple[HostAppReading, ...] = ()
    """The NodeSLO's host applications whose cgroup could be read."""
    psi: PsiReading | None = None
    """The node's pressure counters (/proc/pressure, agent.psi); None where the kernel has no PSI."""


# --- formulas (spec §1.4)


def node_cpu_cores(prev: CpuTicks, cur: CpuTicks, *, wall_seconds: float, ticks_per_second: int) -> float | None:
    """Δbusy ticks / (Δwall / jiffy); None when time did not advance or the counters went backwards."""
    delta = cur.busy - prev.busy
    if wall_seconds <= 0 or delta < 0 or ticks_per_second <= 0:
        return None
    return delta / (wall_seconds * ticks_per_second)


def cgroup_cpu_cores(prev_ns: int, cur_ns: int, *, wall_seconds: float) -> float | None:
    """Δ usage ns / Δ wall ns; None when time did not advance or the cgroup was recreated (counter went back)."""
    delta = cur_ns - prev_ns
    if wall_seconds <= 0 or delta < 0:
        return None
    return delta / (wall_seconds * 1e9)


def node_memory_bytes(mem: MemInfo) -> int:
    """MemTotal − MemAvailable, the node memory koordlet reports by default."""
    return max(mem.total_kb - mem.available_kb, 0) * 1024


def node_memory_with_page_cache(mem: MemInfo) -> int:
    return max(mem.total_kb - mem.free_kb, 0) * 1024


def cgroup_memory_bytes(stat: MemoryStat) -> int:
    """Anonymous + unevictable memory: page cache excluded."""
    return stat.inactive_anon + stat.active_anon + stat.unevictable


def cgroup_memory_with_page_cache(stat: MemoryStat) -> int:
    return cgroup_memory_bytes(stat) + stat.active_file + stat.inactive_file


def system_usage(node: tuple[float, int], parts: Iterable[tuple[float, int]]) -> tuple[float, int]:
    """(cores, bytes) of node − Σ parts (the pods, the host applications), each clamped at 0 (spec §1.4)."""
    cpu, mem = node
    for part_cpu, part_mem in parts:
        cpu -= part_cpu
        mem -= part_mem
    return max(cpu, 0.0), max(mem, 0)


# --- sampling


class ContainerSample(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    container_id: str
    sample: Sample
    memory_with_page_cache: int


class PodSample(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    pod: PodRef
    sample: Sample
    memory_with_page_cache: int
    containers: tuple[ContainerSample, ...] = ()
    psi: PsiSample | None = None
    """The pod's PSI stall ratios over the interval (agent.psi); None without pressure files or a previous reading."""
    cpi: CpiCount | None = None
    """The pod's cycles and instructions over a CPI counting window that ended since the previous collection
    (agent.cpi_collect; agent.service attaches it); None almost always."""


class HostAppSample(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    name: str
    priority: PriorityClassName = ""
    qos: QoSClassName = ""
    sample: Sample
    """Memory as a pod's: anonymous + unevictable, page cache excluded."""
    memory_with_page_cache: int


class Tick(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """The samples one reading produced; `node` and `system` are None on the first reading."""

    at: float
    node: Sample | None
    node_memory_with_page_cache: int
    system: Sample | None
    pods: tuple[PodSample, ...] = ()
    node_memory_with_hot_page: int | None = None
    """MemTotal − MemFree − cold page cache; None when the reading had no kidled cold-page count."""
    numa: tuple[numa.NumaSample, ...] = ()
    """Each NUMA node's usage and system usage (agent.numa); empty on the first reading and without NUMA nodes."""
    host_apps: tuple[HostAppSample, ...] = ()
    node_psi: PsiSample | None = None
    """The node's PSI stall ratios over the interval (agent.psi); None without PSI and on the first reading."""


class Sampler:
    """Turns successive readings into samples, keeping the previous counters of every cgroup it saw last time.

    Cgroups missing from a reading are forgotten, so the state never outgrows the node's current pods and host
    applications; a pod, container or host application seen for the first time gives no sample (no previous
    counter), as in koordlet. System usage is node − pods − host applications (spec §1.4): CPU of those sampled,
    memory (without page cache, as the node's) of every one read, sampled yet or not.
    """

    def __init__(self) -> None:
        self._prev_at: float | None = None
        self._prev_cpu: CpuTicks | None = None
        self._prev_ns: dict[tuple[str, str], int] = {}
        self._numa = numa.NumaSampler()
        self._psi = PsiSampler()
        self._prev_app_ns: dict[tuple[str, str], int] = {}
        """By (name, cgroup directory): an application moved to another cgroup starts afresh."""

    def observe(self, reading: NodeReading) -> Tick:
        wall = reading.at - self._prev_at if self._prev_at is not None else 0.0
        node_sample = self._node_sample(reading, wall)
        counters: dict[tuple[str, str], int] = {}
        pods: list[PodSample] = []
        pod_memory = 0
        sampled_pod_cpu = 0.0
        for pod in reading.pods:
            pod_memory += cgroup_memory_bytes(pod.cgroup.memory)
            counters[(pod.uid, "")] = pod.cgroup.cpu_usage_ns
            sample = self._pod_sample(pod, reading.at, wall, counters)
            if sample is not None:
                pods.append(sample)
                sampled_pod_cpu += sample.sample[1]
        self._prev_ns = counters
        pod_psi = self._psi.observe_pods(((p.uid, p.psi) for p in reading.pods), at=reading.at, wall_seconds=wall)
        if pod_psi:
            pods = [
                msgspec.structs.replace(ps, psi=pod_psi[ps.pod.uid]) if ps.pod.uid in pod_psi else ps for ps in pods
            ]
        node_psi = self._psi.observe_node(reading.psi, at=reading.at, wall_seconds=wall)
        apps, sampled_app_cpu, app_memory = self._host_app_samples(reading, wall)
        self._prev_at = reading.at
        system: Sample | None = None
        if node_sample is not None:
            # Pods without a CPU sample yet still hold memory: subtract every pod's memory, sampled CPU only.
            parts = [(sampled_pod_cpu, pod_memory), (sampled_app_cpu, app_memory)]
            cpu, mem = system_usage((node_sample[1], node_sample[2]), parts)
            system = (reading.at, cpu, mem)
        pods_on_numa: dict[int, int] = {}
        for pod in reading.pods:
            for node_id, amount in pod.numa_memory.items():
                pods_on_numa[node_id] = pods_on_numa.get(node_id, 0) + amount
        numa_samples = self._numa.observe(
            reading.numa,
            wall_seconds=wall,
            ticks_per_second=reading.clock_ticks_per_second,
            system_cpu=None if system is None else system[1],
            pods_on_numa=pods_on_numa,
        )
        return Tick(
            at=reading.at,
            node=node_sample,
            node_memory_with_page_cache=node_memory_with_page_cache(reading.memory),
            system=system,
            pods=tuple(pods),
            node_memory_with_hot_page=(
                None
                if reading.cold_page_bytes is None
                else kidled.node_memory_with_hot_page(reading.memory, reading.cold_page_bytes)
            ),
            numa=numa_samples,
            host_apps=apps,
            node_psi=node_psi,
        )

    def _host_app_samples(self, reading: NodeReading, wall: float) -> tuple[tuple[HostAppSample, ...], float, int]:
        """The host applications' samples, their sampled CPU and the memory of every one read."""
        counters: dict[tuple[str, str], int] = {}
        samples: list[HostAppSample] = []
        cpu, memory = 0.0, 0
        for app in reading.host_apps:
            mem = cgroup_memory_bytes(app.cgroup.memory)
            memory += mem
            key = (app.name, app.cgroup_dir)
            counters[key] = app.cgroup.cpu_usage_ns
            prev = self._prev_app_ns.get(key)
            cores = None if prev is None else cgroup_cpu_cores(prev, app.cgroup.cpu_usage_ns, wall_seconds=wall)
            if cores is None:
                continue
            cpu += cores
            samples.append(
                HostAppSample(
                    name=app.name,
                    priority=app.priority,
                    qos=app.qos,
                    sample=(reading.at, cores, mem),
                    memory_with_page_cache=app.memory_usage,
                )
            )
        self._prev_app_ns = counters
        return tuple(samples), cpu, memory

    def _node_sample(self, reading: NodeReading, wall: float) -> Sample | None:
        prev, self._prev_cpu = self._prev_cpu, reading.cpu
        if prev is None:
            return None
        cores = node_cpu_cores(prev, reading.cpu, wall_seconds=wall, ticks_per_second=reading.clock_ticks_per_second)
        if cores is None:
            return None
        # Tick counters and the wall clock are read at slightly different instants; never report more than exists.
        return (reading.at, min(cores, float(reading.cpu_count)), node_memory_bytes(reading.memory))

    def _cgroup_cores(self, key: tuple[str, str], cur_ns: int, wall: float) -> float | None:
        prev = self._prev_ns.get(key)
        return None if prev is None else cgroup_cpu_cores(prev, cur_ns, wall_seconds=wall)

    def _pod_sample(
        self, pod: PodReading, at: float, wall: float, counters: dict[tuple[str, str], int]
    ) -> PodSample | None:
        containers: list[ContainerSample] = []
        for c in sorted(pod.containers, key=lambda c: c.container_id):
            counters[(pod.uid, c.container_id)] = c.cgroup.cpu_usage_ns
            cores = self._cgroup_cores((pod.uid, c.container_id), c.cgroup.cpu_usage_ns, wall)
            if cores is not None:
                mem = c.cgroup.memory
                containers.append(
                    ContainerSample(
                        container_id=c.container_id,
                        sample=(at, cores, cgroup_memory_bytes(mem)),
                        memory_with_page_cache=cgroup_memory_with_page_cache(mem),
                    )
                )
        cores = self._cgroup_cores((pod.uid, ""), pod.cgroup.cpu_usage_ns, wall)
        if cores is None:
            return None
        mem = pod.cgroup.memory
        return PodSample(
            pod=PodRef(uid=pod.uid, kube_qos=pod.kube_qos),
            sample=(at, cores, cgroup_memory_bytes(mem)),
            memory_with_page_cache=cgroup_memory_with_page_cache(mem),
            containers=tuple(containers),
        )
