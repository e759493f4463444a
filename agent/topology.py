"""The node's hardware topology as the agent reports it (NodeTopologyReported, issue 23.4), built from file contents.
Pure: agent.topology_watch reads the files (and the CPUs, agent.cpus.read_cpus) and publishes the report; simulated
nodes (agent.simulate) hand in the files a real node of their size would have.

What is read, all named by `Layout`: each NUMA node's `<sys>/devices/system/node/nodeN/` — `cpulist` (its CPUs, only
the online ones counted), `meminfo` (MemTotal) and `hugepages/hugepages-{2048,1048576}kB/nr_hugepages`; a machine
without node directories is one zone 0 holding every online CPU, with `<proc>/meminfo`'s MemTotal and
`<sys>/kernel/mm/hugepages/…`. A zone's `memory` is MemTotal less both huge page pools, at least 0, as koordlet
reports it. `<proc>/cpuinfo` gives the CPU model and vendor; hyper-threading is on when some core (socket, core id)
has two logical CPUs; turbo is read from `<sys>/devices/system/cpu/intel_pstate/no_turbo` ("0": on), else
`<sys>/devices/system/cpu/cpufreq/boost` ("1": on), else off. The kubelet's CPU manager comes from
`<kubelet root>/cpu_manager_state` (absent: policy `none`); its checksum is not verified (the kubelet's is a hash
of Go's printed struct).

Nothing here raises on what a node holds: a file missing, unreadable or malformed becomes a `problems` entry naming
the file and what is wrong, the part it feeds keeps its default, and every list is cut to the schema's bounds (with a
problem saying so), so the report always validates.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

import msgspec

from agent.suppress import Cpu, format_cpuset, parse_cpuset
from schemas import node_topology as nt
from schemas.node_topology import NodeTopologyReported

KiB: Final = 1024
MAX_STATE_FILE_BYTES: Final = 1 << 20
"""A kubelet state file larger than this is refused (a real one is a few KiB even at hundreds of pods)."""
SYSFS_READ_BYTES: Final = 64 * KiB
"""What is read of every other file: /proc/cpuinfo runs to megabytes on large machines, and only its first processor
is needed."""
MAX_BYTES: Final = 2**53
MAX_TOPOLOGY_ID: Final = 1_000_000
MAX_LIST_CHARS: Final = 16_384
MAX_PROBLEM_CHARS: Final = 1024
MAX_TEXT_CHARS: Final = 256
HUGEPAGE_POOLS: Final = (("2048kB", 2 * KiB * KiB), ("1048576kB", KiB * KiB * KiB))
"""(sysfs directory suffix, page size in bytes) of the 2 MiB and 1 GiB pools, in the report's field order."""

_MEM_TOTAL = re.compile(r"^(?:Node\s+\d+\s+)?MemTotal:\s+(\d+)\s*kB\s*$", re.MULTILINE)
_POD_UID = re.compile(r"^[0-9A-Za-z_\-]{1,64}$")


@dataclass(frozen=True)
class Unreadable:
    """A file that exists but could not be read, and why (an absent file is simply not in the mapping)."""

    reason: str


Files = Mapping[str, bytes | Unreadable]
"""Path → the file's first bytes (see SYSFS_READ_BYTES, MAX_STATE_FILE_BYTES), or why it could not be read."""


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where each file of the report is, under the agent's sysfs, procfs and kubelet roots."""

    sys_root: str
    proc_root: str
    kubelet_root_dir: str

    @property
    def node_dir(self) -> str:
        return _join(self.sys_root, "devices/system/node")

    def node_file(self, node_id: int, name: str) -> str:
        return _join(self.node_dir, f"node{node_id}/{name}")

    def hugepages(self, node_id: int | None, pool: str) -> str:
        """nr_hugepages of a pool: per NUMA node, or machine-wide (None)."""
        where = f"hugepages/hugepages-{pool}/nr_hugepages"
        return self.node_file(node_id, where) if node_id is not None else _join(self.sys_root, f"kernel/mm/{where}")

    @property
    def machine_meminfo(self) -> str:
        return _join(self.proc_root, "meminfo")

    @property
    def cpuinfo(self) -> str:
        return _join(self.proc_root, "cpuinfo")

    @property
    def no_turbo(self) -> str:
        return _join(self.sys_root, "devices/system/cpu/intel_pstate/no_turbo")

    @property
    def boost(self) -> str:
        return _join(self.sys_root, "devices/system/cpu/cpufreq/boost")

    @property
    def kubelet_state(self) -> str:
        return _join(self.kubelet_root_dir, "cpu_manager_state")

    def files(self, node_ids: Sequence[int]) -> list[tuple[str, int]]:
        """Every file a report reads, with how many bytes to read of it (one more than the state file may hold, so
        an oversized one is seen)."""
        nodes = _node_ids(node_ids, [])
        paths = [self.cpuinfo, self.no_turbo, self.boost]
        if nodes:
            for n in nodes:
                paths += [self.node_file(n, "cpulist"), self.node_file(n, "meminfo")]
                paths += [self.hugepages(n, pool) for pool, _ in HUGEPAGE_POOLS]
        else:
            paths += [self.machine_meminfo, *(self.hugepages(None, pool) for pool, _ in HUGEPAGE_POOLS)]
        return [(p, SYSFS_READ_BYTES) for p in paths] + [(self.kubelet_state, MAX_STATE_FILE_BYTES + 1)]


def _join(root: str, rest: str) -> str:
    return f"{root.rstrip('/')}/{rest}"


# --- parsers of one file's text (ValueError when malformed)


def mem_total_bytes(meminfo: str) -> int:
    """MemTotal in bytes, from a NUMA node's meminfo ("Node 0 MemTotal: … kB") or /proc/meminfo ("MemTotal: … kB")."""
    found = _MEM_TOTAL.search(meminfo)
    if found is None:
        raise ValueError("no MemTotal line in kB")
    total = int(found.group(1)) * KiB
    if total > MAX_BYTES:
        raise ValueError(f"MemTotal {found.group(1)} kB is beyond {MAX_BYTES} bytes")
    return total


def hugepage_count(text: str) -> int:
    """An nr_hugepages file: one non-negative count."""
    value = text.strip()
    if not (value.isascii() and value.isdigit()):
        raise ValueError(f"not a page count: {value[:40]!r}")
    return int(value)


def cpu_model(cpuinfo: str) -> tuple[str, str]:
    """(model name, vendor_id) of the first processor that names them; "" each where none does (ARM's cpuinfo has
    neither)."""
    found: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        key = key.strip()
        if sep and key in ("model name", "vendor_id") and key not in found:
            found[key] = value.strip()[:MAX_TEXT_CHARS]
            if len(found) == 2:
                break
    return found.get("model name", ""), found.get("vendor_id", "")


def hyper_threading(cpus: Iterable[Cpu]) -> bool:
    """Whether some core (same socket and core id) has more than one logical CPU."""
    seen: set[tuple[int, int]] = set()
    for cpu in cpus:
        key = (cpu.socket, cpu.core)
        if key in seen:
            return True
        seen.add(key)
    return False


def turbo_enabled(no_turbo: str | None, boost: str | None) -> bool:
    """intel_pstate's `no_turbo` when the machine has it ("0": turbo on), else cpufreq's `boost` ("1": on, the
    acpi-cpufreq and AMD drivers), else off (None: the file is absent)."""
    if no_turbo is not None:
        return no_turbo.strip() == "0"
    return boost is not None and boost.strip() == "1"


class _CpuManagerState(msgspec.Struct, frozen=True, rename="camel"):
    """The kubelet's checkpoint (pkg/kubelet/cm/cpumanager/state/checkpoint.go, CPUManagerCheckpointV2)."""

    policy_name: str
    default_cpu_set: str = ""
    entries: dict[str, dict[str, str]] | None = None
    checksum: int | None = None


@dataclass(frozen=True, kw_only=True)
class CpuManagerState:
    policy: str
    default_cpus: frozenset[int]
    pods: dict[str, frozenset[int]]
    """Pod UID → the union of its containers' CPUs (pods with none left out)."""


def parse_cpu_manager_state(data: bytes) -> CpuManagerState:
    """The kubelet's `cpu_manager_state` JSON; ValueError naming what is wrong (oversized, not JSON of that shape,
    a policy name or pod UID out of bounds, a cpuset not in the kernel's list format)."""
    if len(data) > MAX_STATE_FILE_BYTES:
        raise ValueError(f"larger than {MAX_STATE_FILE_BYTES} bytes")
    try:
        state = msgspec.json.decode(data, type=_CpuManagerState)
    except msgspec.DecodeError as e:
        raise ValueError(f"not a CPU manager checkpoint: {e}") from None
    policy = state.policy_name.strip()
    if not policy or len(policy) > MAX_TEXT_CHARS or not policy.isprintable():
        raise ValueError(f"policyName {state.policy_name[:64]!r} is not a policy name")
    default = _cpuset(state.default_cpu_set, "defaultCpuSet")
    pods: dict[str, frozenset[int]] = {}
    for uid, containers in (state.entries or {}).items():
        if not _POD_UID.match(uid):
            raise ValueError(f"entry {uid[:80]!r} is not a pod UID")
        cpus: set[int] = set()
        for container, cpuset in containers.items():
            cpus |= _cpuset(cpuset, f"entry {uid}/{container[:80]}")
        if cpus:
            pods[uid] = frozenset(cpus)
    return CpuManagerState(policy=policy, default_cpus=frozenset(default), pods=pods)


def _cpuset(text: str, what: str) -> set[int]:
    try:
        return parse_cpuset(text)
    except ValueError as e:
        raise ValueError(f"{what}: bad cpuset {text[:80]!r} ({e})") from None


# --- the report


def build_report(
    *,
    node: str,
    at: float,
    layout: Layout,
    cpus: Sequence[Cpu],
    node_ids: Sequence[int],
    files: Files,
    reserved_cpus: str = "",
    problems: Sequence[str] = (),
) -> NodeTopologyReported:
    """The report from what was read: the online CPUs with their topology (agent.cpus.read_cpus), the NUMA node
    directories found (empty: none), the files `layout.files(node_ids)` names (absent ones left out), the agent's
    `reserved_cpus` setting, and what the reader itself could not read (`problems`)."""
    found = list(problems)
    reports = _cpu_reports(cpus, found)
    zones = _zones(layout, cpus, node_ids, files, found)
    model, vendor = cpu_model(_text(files, layout.cpuinfo, found, required=True) or "")
    basic = nt.CpuBasicInfo(
        cpu_model=model,
        vendor_id=vendor,
        hyper_thread_enabled=hyper_threading(cpus),
        turbo_enabled=turbo_enabled(
            _text(files, layout.no_turbo, found, required=False), _text(files, layout.boost, found, required=False)
        ),
    )
    kubelet = _kubelet(layout.kubelet_state, files.get(layout.kubelet_state), reserved_cpus, found)
    return NodeTopologyReported(
        node=node, at=at, zones=zones, cpus=reports, basic=basic, kubelet=kubelet, problems=bounded_problems(found)
    )


def same_topology(a: NodeTopologyReported, b: NodeTopologyReported) -> bool:
    """Whether two reports say the same, whenever they were read."""
    return msgspec.structs.replace(a, at=0.0) == msgspec.structs.replace(b, at=0.0)


def _text(files: Files, path: str, problems: list[str], *, required: bool) -> str | None:
    data = files.get(path)
    if data is None:
        if required:
            problems.append(f"{path}: missing")
        return None
    if isinstance(data, Unreadable):
        problems.append(f"{path}: cannot read: {data.reason}")
        return None
    return data.decode("utf-8", "replace")


def _cpu_reports(cpus: Sequence[Cpu], problems: list[str]) -> list[nt.CpuReport]:
    reports: list[nt.CpuReport] = []
    out_of_range: list[Cpu] = []
    for cpu in sorted(cpus, key=lambda c: c.id):
        if all(0 <= v <= MAX_TOPOLOGY_ID for v in (cpu.id, cpu.core, cpu.socket)) and 0 <= cpu.numa < nt.MAX_NUMA_NODES:
            reports.append(nt.CpuReport(id=cpu.id, core=cpu.core, socket=cpu.socket, numa=cpu.numa))
        else:
            out_of_range.append(cpu)
    if out_of_range:
        first = out_of_range[0]
        problems.append(
            f"{len(out_of_range)} CPUs left out of the CPU list: a core, socket or NUMA id out of range (cpu "
            f"{first.id}: core {first.core}, socket {first.socket}, NUMA node {first.numa})"
        )
    if len(reports) > nt.MAX_CPUS:
        problems.append(f"{len(reports)} CPUs: only the first {nt.MAX_CPUS} listed")
        reports = reports[: nt.MAX_CPUS]
    return reports


def _node_ids(node_ids: Sequence[int], problems: list[str]) -> list[int]:
    ids = sorted(set(node_ids))
    kept = [n for n in ids if 0 <= n < nt.MAX_NUMA_NODES]
    if len(kept) < len(ids):
        problems.append(f"NUMA nodes {sorted(set(ids) - set(kept))[:8]} left out: ids above {nt.MAX_NUMA_NODES - 1}")
    return kept


def _zones(
    layout: Layout, cpus: Sequence[Cpu], node_ids: Sequence[int], files: Files, problems: list[str]
) -> list[nt.NumaZoneReport]:
    online = {c.id for c in cpus}
    nodes = _node_ids(node_ids, problems)
    if not nodes:
        total = _mem_total(files, layout.machine_meminfo, problems)
        pages = [_pages(files, layout.hugepages(None, pool), problems) for pool, _ in HUGEPAGE_POOLS]
        return [_zone(0, online, total, pages, problems)]
    zones = []
    listed: set[int] = set()
    for n in nodes:
        cpulist_path = layout.node_file(n, "cpulist")
        text = _text(files, cpulist_path, problems, required=True)
        try:
            members = parse_cpuset(text or "")
        except ValueError as e:
            problems.append(f"{cpulist_path}: {e}")
            members = set()
        if online:
            members &= online  # a node's cpulist may still name CPUs taken offline
        listed |= members
        total = _mem_total(files, layout.node_file(n, "meminfo"), problems)
        pages = [_pages(files, layout.hugepages(n, pool), problems) for pool, _ in HUGEPAGE_POOLS]
        zones.append(_zone(n, members, total, pages, problems))
    unlisted = online - listed
    if unlisted:
        problems.append(f"online CPUs {_cpulist(unlisted, problems)} are in no NUMA node's cpulist")
    return zones


def _zone(numa: int, cpus: set[int], mem_total: int, pages: list[int], problems: list[str]) -> nt.NumaZoneReport:
    pools = [min(count * size, MAX_BYTES) for count, (_, size) in zip(pages, HUGEPAGE_POOLS, strict=True)]
    return nt.NumaZoneReport(
        numa=numa,
        cpus=_cpulist(cpus, problems),
        cpu_count=len(cpus),
        memory=max(mem_total - sum(pools), 0),
        hugepages_2mi=pools[0],
        hugepages_1gi=pools[1],
    )


def _mem_total(files: Files, path: str, problems: list[str]) -> int:
    text = _text(files, path, problems, required=True)
    if text is None:
        return 0
    try:
        return mem_total_bytes(text)
    except ValueError as e:
        problems.append(f"{path}: {e}")
        return 0


def _pages(files: Files, path: str, problems: list[str]) -> int:
    """A pool's page count; 0 when the file is absent (no such pool on this kernel)."""
    text = _text(files, path, problems, required=False)
    if text is None:
        return 0
    try:
        return hugepage_count(text)
    except ValueError as e:
        problems.append(f"{path}: {e}")
        return 0


def _kubelet(
    path: str, data: bytes | Unreadable | None, reserved_cpus: str, problems: list[str]
) -> nt.KubeletCpuManager:
    try:
        reserved = _cpulist(parse_cpuset(reserved_cpus), problems)
    except ValueError as e:
        problems.append(f"the reserved_cpus setting {reserved_cpus[:80]!r}: {e}")
        reserved = ""
    if data is None:
        return nt.KubeletCpuManager(reserved_cpus=reserved)
    if isinstance(data, Unreadable):
        problems.append(f"{path}: cannot read: {data.reason}")
        return nt.KubeletCpuManager(reserved_cpus=reserved)
    try:
        state = parse_cpu_manager_state(data)
    except ValueError as e:
        problems.append(f"{path}: {e}")
        return nt.KubeletCpuManager(reserved_cpus=reserved)
    allocs = [nt.PodCpuAlloc(uid=uid, cpus=_cpulist(state.pods[uid], problems)) for uid in sorted(state.pods)]
    if len(allocs) > nt.MAX_POD_ALLOCS:
        problems.append(f"{path}: {len(allocs)} pods with exclusive CPUs, only the first {nt.MAX_POD_ALLOCS} listed")
        allocs = allocs[: nt.MAX_POD_ALLOCS]
    return nt.KubeletCpuManager(
        policy=state.policy,
        default_cpus=_cpulist(state.default_cpus, problems),
        reserved_cpus=reserved,
        pod_allocs=allocs,
    )


def _cpulist(ids: Iterable[int], problems: list[str]) -> str:
    """The kernel's list form ("0-3,8"), cut at a whole entry to the schema's length (with a problem)."""
    text = format_cpuset(ids)
    if len(text) <= MAX_LIST_CHARS:
        return text
    cut = text[: MAX_LIST_CHARS + 1].rsplit(",", 1)[0]
    problems.append(f"a cpu list of {len(text)} characters cut to {len(cut)} (ending at {cut.rsplit(',', 1)[-1]})")
    return cut


def bounded_problems(problems: Sequence[str]) -> list[str]:
    """Each problem cut to the schema's length, and at most MAX_PROBLEMS of them (the last saying how many more)."""
    cut = [p if len(p) <= MAX_PROBLEM_CHARS else p[: MAX_PROBLEM_CHARS - 1] + "…" for p in problems]
    if len(cut) > nt.MAX_PROBLEMS:
        cut = [*cut[: nt.MAX_PROBLEMS - 1], f"… and {len(cut) - nt.MAX_PROBLEMS + 1} more problems"]
    return cut
