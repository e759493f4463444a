"""What the agent's QoS loops want written, and in which order: pure planning over pods, the effective NodeSLO and
what was read from the files (issue 6).

The shell (agent/loops/runner.py) lists the node's pods, reads the current value of every file a plan names, and
writes only what `plan` returns. Paths are relative to the cgroup root (`cpu/…`, `memory/…` on v1, no controller
directory on v2) or the resctrl root, built only from validated names (pod UIDs, container IDs, the kubepods parent),
so a plan can never name a file outside its root.

* BE cgroups (spec §5.7): `be_cgroup_wants` — for each active BE pod, the pod's and each running container's cpu
  shares/weight, CFS quota/cpu.max and memory limit from agent.qos.be_cgroup. Values are range-checked; a pod whose
  values cannot be computed (bad annotation) is a Problem, not a partial write.
* Ordering (`plan`): a limit is never written below a child's or above its parent's mid-plan — decreases go
  deepest first, increases shallowest first. At most `limit` writes per round; the rest is `deferred`.
* Resctrl (§5.4): `resctrl_schemata` — per group (LSR, LS, BE) the L3 mask and MBA lines; `schemata_differs`
  compares parsed values (the kernel pads and zero-fills what it prints); `group_of` maps a pod to its group.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from agent import core, memory_qos, qos
from schemas import kube, vocab

UNLIMITED_MEMORY_FLOOR: Final = 1 << 62
"""cgroup v1 reports "no limit" as the largest page-aligned int64 (9223372036854771712); anything this large is -1."""
MAX_MEMORY_BYTES: Final = 1 << 50
RESCTRL_GROUPS: Final = ("LSR", "LS", "BE")
_GROUP_OF_CLASS: Final[Mapping[str, str]] = {
    vocab.QOS_LSE: "LSR",
    vocab.QOS_LSR: "LSR",
    vocab.QOS_LS: "LS",
    vocab.QOS_BE: "BE",
}
_CLASS_KEY_OF_GROUP: Final[Mapping[str, str]] = {"LSR": "lsrClass", "LS": "lsClass", "BE": "beClass"}
_SCHEMATA_ENTRY: Final = re.compile(r"^\s*(\d+)\s*=\s*([0-9a-fA-F]+)\s*$")
RESCTRL_POD_ANNOTATION: Final = "node.koordinator.sh/resctrl"


@dataclass(frozen=True, kw_only=True)
class Layout:
    """Where kubepods lives: cgroup version, the kubelet's driver, and the parent under each hierarchy."""

    version: int
    driver: core.Driver
    parent: str = ""

    def hierarchy(self, controller: str) -> str:
        """`cpu` / `memory` / `cpuset` on v1; "" on v2 (one unified hierarchy)."""
        return "" if self.version == 2 else controller

    def pod_dir(self, kube_qos: str, uid: str) -> str:
        """The pod's cgroup directory relative to a hierarchy; AgentNameError for a malformed uid."""
        if not core.is_pod_uid(uid):
            raise core.AgentNameError(f"pod uid {uid!r} is not a pod UID")
        if self.driver == "cgroupfs":
            name = f"pod{uid}"
        else:
            kind = core.qos_dir("cgroupfs", kube_qos)  # "", "burstable" or "besteffort"
            name = f"kubepods-{kind + '-' if kind else ''}pod{uid.replace('-', '_')}.slice"
        return f"{self.qos_dir(kube_qos)}/{name}"

    def qos_dir(self, kube_qos: str) -> str:
        return "/".join(
            p for p in (self.parent, core.KUBEPODS_DIR[self.driver], core.qos_dir(self.driver, kube_qos)) if p
        )

    def container_dir(self, pod_dir: str, runtime: str, container_id: str) -> str:
        if not core.is_container_id(container_id):
            raise core.AgentNameError(f"container id {container_id!r} is not a container ID")
        if self.driver == "cgroupfs":
            return f"{pod_dir}/{container_id}"
        scope = {"containerd": "cri-containerd", "docker": "docker", "cri-o": "crio", "crio": "crio"}.get(runtime)
        if scope is None:
            raise core.AgentNameError(f"container runtime {runtime!r} has no known systemd scope name")
        return f"{pod_dir}/{scope}-{container_id}.scope"

    def file(self, controller: str, directory: str, name: str) -> str:
        return "/".join(p for p in (self.hierarchy(controller), directory, name) if p)


@dataclass(frozen=True, kw_only=True)
class NodePod:
    """A pod as the kubelet lists it: the object, and its containers' runtime and ID (running ones only)."""

    pod: kube.Pod
    containers: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    """container name → (runtime, container ID) from status.containerStatuses."""

    @property
    def uid(self) -> str:
        return self.pod.metadata.uid

    @property
    def key(self) -> str:
        return f"{self.pod.metadata.namespace}/{self.pod.metadata.name}"

    @property
    def koord_qos(self) -> str:
        return vocab.qos_class_with_default(self.pod.metadata.labels, self.pod.status.qos_class)


@dataclass(frozen=True, kw_only=True)
class Want:
    """One file and the value it should hold."""

    path: str
    value: str
    reason: str
    depth: int = 0
    """Nesting under kubepods (pod 0, container 1): `plan` orders by it."""


@dataclass(frozen=True, kw_only=True)
class Problem:
    target: str
    reason: str


@dataclass(frozen=True, kw_only=True)
class Plan:
    writes: list[tuple[Want, str]]
    """(want, current value) to write, in this order."""
    deferred: int = 0
    missing: list[Want] = field(default_factory=list)
    """Wanted files that do not exist (a pod not started yet, a cgroup gone): skipped this round."""


# --- BE cgroups (§5.7)


def _checked(name: str, value: int | str) -> str:
    """The value as written, after a range check; QoSError for anything a kernel must never get from us."""
    if value in ("max", -1):
        if name in ("cpu.shares", "cpu.weight"):
            raise qos.QoSError(f"{name} cannot be unlimited")
        return str(value)
    assert isinstance(value, int)
    bounds = {
        "cpu.shares": (qos.MIN_SHARES, qos.MAX_SHARES),
        "cpu.weight": (qos.MIN_WEIGHT, qos.MAX_WEIGHT),
        "cpu.cfs_quota_us": (qos.MIN_QUOTA_US, 1 << 40),
        "cpu.max": (qos.MIN_QUOTA_US, 1 << 40),
        "memory.limit_in_bytes": (1 << 20, MAX_MEMORY_BYTES),
        "memory.max": (1 << 20, MAX_MEMORY_BYTES),
    }
    low, high = bounds[name]
    if not low <= value <= high:
        raise qos.QoSError(f"{name} {value} is outside [{low}, {high}]")
    return str(value)


def _controller(file_name: str) -> str:
    return file_name.split(".", 1)[0]


def be_cgroup_wants(
    pods: Iterable[NodePod],
    layout: Layout,
    slo: Mapping[str, Any],
    *,
    cpu_normalization_ratio: float | None = None,
    quota_unlimited: bool = False,
) -> tuple[list[Want], list[Problem]]:
    """What every active BE pod's cgroups should hold. The CFS quota is left unlimited when CPU suppress runs
    with the cfsQuota policy (§5.7), as Koordinator does, and while `quota_unlimited` (the fail-safe pins the
    besteffort quota: on cgroup v1 the kernel refuses a parent's quota below a child's, so the pods' own go first)."""
    threshold = slo.get("resourceUsedThresholdWithBE", {})
    suppressed = threshold.get("enable") and threshold.get("cpuSuppressPolicy") == "cfsQuota"
    cfs_quota = not (suppressed or quota_unlimited)
    wants: list[Want] = []
    problems: list[Problem] = []
    for node_pod in pods:
        pod = node_pod.pod
        if node_pod.koord_qos != vocab.QOS_BE or not kube.is_running_or_pending(pod):
            continue
        try:
            pod_files, container_files = qos.be_cgroup(
                pod, version=layout.version, cfs_quota=cfs_quota, ratio=cpu_normalization_ratio
            )
            pod_dir = layout.pod_dir(pod.status.qos_class or vocab.KUBE_QOS_BESTEFFORT, node_pod.uid)
            pod_wants = [
                Want(
                    path=layout.file(_controller(name), pod_dir, name),
                    value=_checked(name, value),
                    reason=f"BE pod {node_pod.key}: {name} from its batch resources (§5.7)",
                )
                for name, value in pod_files.items()
            ]
            container_wants: list[Want] = []
            for container, files in container_files.items():
                if container not in node_pod.containers:
                    continue  # not running yet: its directory does not exist
                runtime, container_id = node_pod.containers[container]
                directory = layout.container_dir(pod_dir, runtime, container_id)
                container_wants += [
                    Want(
                        path=layout.file(_controller(name), directory, name),
                        value=_checked(name, value),
                        reason=f"BE container {node_pod.key}/{container}: {name} from its batch resources (§5.7)",
                        depth=1,
                    )
                    for name, value in files.items()
                ]
        except (qos.QoSError, core.AgentNameError, ValueError) as e:
            problems.append(Problem(target=node_pod.key, reason=str(e)))
            continue
        wants += pod_wants + container_wants
    return wants, problems


def memory_qos_wants(
    pods: Iterable[NodePod], layout: Layout, slo: Mapping[str, Any], *, node_memory: int
) -> tuple[list[Want], list[Problem]]:
    """memory.min / memory.low / memory.high of every running container of every active pod of a class with memory
    QoS (agent.memory_qos; a class with it off gets the "none" values). BE pods' request and limit are their
    batch-memory, the others' their memory."""
    strategy = slo.get("resourceQOSStrategy", {})
    wants: list[Want] = []
    problems: list[Problem] = []
    for node_pod in pods:
        pod = node_pod.pod
        klass = memory_qos.CLASS_OF_QOS.get(node_pod.koord_qos)
        if klass is None or not kube.is_running_or_pending(pod) or not node_pod.containers:
            continue
        config = strategy.get(klass, {}).get("memoryQOS", {})
        try:
            if node_pod.koord_qos == vocab.QOS_BE:
                amounts = {
                    name: (requests.get(vocab.BATCH_MEMORY, 0), limits.get(vocab.BATCH_MEMORY))
                    for name, (requests, limits) in qos.container_batch(pod).items()
                }
            else:
                amounts = {
                    c.name: (
                        kube.resource_amounts(c.resources.requests).get("memory", 0),
                        kube.resource_amounts(c.resources.limits).get("memory"),
                    )
                    for c in pod.spec.containers or ()
                }
            pod_dir = layout.pod_dir(pod.status.qos_class or kube.pod_kube_qos(pod), node_pod.uid)
            for container, (runtime, container_id) in sorted(node_pod.containers.items()):
                request, limit = amounts.get(container, (0, None))
                values = memory_qos.container_values(int(request), limit, config, node_memory=node_memory)
                directory = layout.container_dir(pod_dir, runtime, container_id)
                wants += [
                    Want(
                        path=layout.file("memory", directory, name),
                        value=value,
                        reason=f"{klass} memory QoS of {node_pod.key}/{container} (request {request}, limit {limit})",
                        depth=1,
                    )
                    for name, value in values.items()
                ]
        except (qos.QoSError, core.AgentNameError, ValueError) as e:
            problems.append(Problem(target=node_pod.key, reason=str(e)))
    return wants, problems


def normalize(path: str, text: str | None) -> str | None:
    """A file's content as comparable to a Want's value: unlimited as -1/max, cpu.max's quota only."""
    if text is None:
        return None
    value = text.strip()
    name = path.rsplit("/", 1)[-1]
    if name == "cpu.max":
        return value.split()[0] if value else value
    if name == "memory.limit_in_bytes" and value.isdigit() and int(value) >= UNLIMITED_MEMORY_FLOOR:
        return "-1"
    return value


def _grows(want: Want, current: str) -> bool:
    def size(v: str) -> float:
        return float("inf") if v in ("-1", "max") else float(v)

    try:
        return size(want.value) >= size(current)
    except ValueError:
        return True


def plan(wants: Sequence[Want], current: Mapping[str, str | None], *, limit: int) -> Plan:
    """The writes that bring `current` (path → normalized content, None when the file is missing) to `wants`:
    decreases deepest first, then increases shallowest first, at most `limit` of them."""
    missing = [w for w in wants if current.get(w.path) is None]
    differing = [(w, c) for w in wants if (c := current.get(w.path)) is not None and c != w.value]
    shrinking = sorted((p for p in differing if not _grows(*p)), key=lambda p: -p[0].depth)
    growing = sorted((p for p in differing if _grows(*p)), key=lambda p: p[0].depth)
    ordered = shrinking + growing
    return Plan(writes=ordered[:limit], deferred=max(len(ordered) - limit, 0), missing=missing)


# --- resctrl (§5.4)


@dataclass(frozen=True, kw_only=True)
class ResctrlInfo:
    """What the resctrl root says about the machine: the L3 CBM, the cache ids, whether MBA is there, the vendor."""

    cbm: int
    cache_ids: tuple[int, ...]
    mba: bool
    vendor: str


def group_of(node_pod: NodePod, slo: Mapping[str, Any]) -> str | None:
    """The resctrl group a pod's threads go to; None when its class has none or resctrl QoS off, or the pod has
    its own group (the resctrl annotation)."""
    group = _GROUP_OF_CLASS.get(node_pod.koord_qos)
    if group is None or RESCTRL_POD_ANNOTATION in node_pod.pod.metadata.annotations:
        return None
    qos_class = slo["resourceQOSStrategy"][_CLASS_KEY_OF_GROUP[group]]
    return group if qos_class["resctrlQOS"].get("enable") else None


def resctrl_schemata(slo: Mapping[str, Any], info: ResctrlInfo) -> dict[str, dict[str, str]]:
    """Group → resource ("L3", "MB") → the schemata line; QoSError names the class whose values are unusable."""
    out: dict[str, dict[str, str]] = {}
    strategy = slo["resourceQOSStrategy"]
    for group in RESCTRL_GROUPS:
        values = strategy[_CLASS_KEY_OF_GROUP[group]]["resctrlQOS"]
        start, end = values.get("catRangeStartPercent", 0), values.get("catRangeEndPercent", 100)
        try:
            lines = {"L3": qos.schemata_line("L3", info.cache_ids, qos.l3_mask(info.cbm, start, end))}
        except qos.QoSError as e:
            raise qos.QoSError(f"{_CLASS_KEY_OF_GROUP[group]}: {e}") from None
        mba = qos.mba_value(values.get("mbaPercent"), info.vendor) if info.mba else None
        if mba is not None:
            lines["MB"] = qos.schemata_line("MB", info.cache_ids, mba)
        out[group] = lines
    return out


def parse_schemata(text: str) -> dict[str, dict[int, int]]:
    """resource → cache id → value, from a schemata file as the kernel prints it (padded, zero-filled hex)."""
    out: dict[str, dict[int, int]] = {}
    for line in text.splitlines():
        resource, _, entries = line.strip().partition(":")
        if not entries:
            continue
        values: dict[int, int] = {}
        for entry in entries.split(";"):
            m = _SCHEMATA_ENTRY.match(entry)
            if m:
                values[int(m.group(1))] = int(m.group(2), 10 if resource.strip() == "MB" else 16)
        out[resource.strip()] = values
    return out


def schemata_differs(line: str, current: Mapping[str, Mapping[int, int]]) -> bool:
    """Whether writing `line` (one resource) would change what `current` (parse_schemata) holds."""
    wanted = parse_schemata(line)
    return any(current.get(resource) != values for resource, values in wanted.items())


def cache_ids_of(root_schemata: str) -> tuple[int, ...]:
    """The L3 cache ids on the root group's schemata; QoSError when there is no L3 line."""
    ids = parse_schemata(root_schemata).get("L3")
    if not ids:
        raise qos.QoSError("the resctrl root schemata has no L3 line")
    return tuple(sorted(ids))
