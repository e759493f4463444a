"""The NodeSLO's host applications as the agent measures them (spec §1.4, §1.6 item 6, §7.1): each entry of
`spec.hostApplications` checked, and the cgroup directory its usage is read from. Pure.

Called by agent/collect.py (Collector) whenever the NodeSLO in effect changes, and by its reads each collection.
The entries come from the cluster (the slo-controller-config ConfigMap, rendered by the slo service) and are hostile
until checked here: an entry that is not an object, has a name that is not one plain path component
(schemas.names.host_application_name), a priority or QoS class Koordinator does not have, an unknown cgroup base, or
a parentDir / relativePath that is not a relative path of plain names (absolute, `..`, empty parts, over-long) is
skipped with the reason, as is a second entry with a name already taken; beyond MAX_HOST_APPLICATIONS entries the
rest are skipped. The other entries are measured. A directory that resolves outside the cgroup root through a
symlink is refused where it is read (agent/collect.py).

Where an application's cgroup is, by Koordinator's rules (koordlet's GetHostAppCgroupRelativePath): with a
cgroupPath, `<base>/<parentDir>/<relativePath>`, base being the cgroup root (`CgroupRoot`, or no base) or the
kubelet's directory of Guaranteed (`Kubepods`), Burstable (`KubepodsBurstable`) or BestEffort
(`KubepodsBesteffort`) pods for the node's cgroup driver; without one, `host-latency-sensitive/<name>` (QoS LSE,
LSR, LS), `host-best-effort/<name>` (BE) or `<name>` under the cgroup root. Ours refuses a cgroupPath that names its
base itself (both parts empty): that is the whole node, or all of a QoS class's pods, not an application.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final, cast, get_args

import msgspec

from agent import core
from schemas import names, vocab
from schemas.node import MAX_HOST_APPLICATIONS, PriorityClassName, QoSClassName

ROOT: Final = ""
"""HostApp.base of an application under the cgroup root (else its base is a kube QoS class)."""
_BASES: Final[Mapping[str, str]] = {
    "": ROOT,
    "CgroupRoot": ROOT,
    "Kubepods": vocab.KUBE_QOS_GUARANTEED,
    "KubepodsBurstable": vocab.KUBE_QOS_BURSTABLE,
    "KubepodsBesteffort": vocab.KUBE_QOS_BESTEFFORT,
}
_DEFAULT_DIR: Final[Mapping[str, str]] = {
    vocab.QOS_LSE: "host-latency-sensitive",
    vocab.QOS_LSR: "host-latency-sensitive",
    vocab.QOS_LS: "host-latency-sensitive",
    vocab.QOS_BE: "host-best-effort",
}
_PRIORITIES: Final[frozenset[str]] = frozenset(get_args(PriorityClassName))
_QOS_CLASSES: Final[frozenset[str]] = frozenset(get_args(QoSClassName))
MAX_PATH_LENGTH: Final = 1024
"""Characters of a parentDir or relativePath (each part at most 255, the kernel's NAME_MAX)."""
_MAX_PART: Final = 255


class HostApp(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """One host application the agent measures: `path` (plain names joined by "/", never empty) under its `base`."""

    name: str
    priority: PriorityClassName = ""
    qos: QoSClassName = ""
    base: str = ROOT
    """ROOT, or the kube QoS class whose pod directory under kubepods the path starts from."""
    path: str


class Refused(ValueError):
    """Why one hostApplications entry is not measured."""


def parse_host_applications(raw: object) -> tuple[tuple[HostApp, ...], list[str]]:
    """The measurable entries of a NodeSLO's `hostApplications` (None or absent: none), in the spec's order, and a
    reason per entry skipped (each names the entry's index and, where it has one, its name)."""
    if raw is None:
        return (), []
    if not isinstance(raw, list):
        return (), [f"hostApplications is a {type(raw).__name__}, not a list: no host application is measured"]
    apps: list[HostApp] = []
    refused: list[str] = []
    taken: set[str] = set()
    for i, entry in enumerate(raw[:MAX_HOST_APPLICATIONS]):
        label = f"hostApplications[{i}]"
        if isinstance(entry, Mapping) and isinstance(entry.get("name"), str):
            label += f" {names.shown(entry['name'])}"
        try:
            app = host_app(entry)
        except Refused as e:
            refused.append(f"{label}: {e}")
            continue
        if app.name in taken:
            refused.append(f"{label}: the name is taken by an earlier entry")
            continue
        taken.add(app.name)
        apps.append(app)
    if len(raw) > MAX_HOST_APPLICATIONS:
        refused.append(
            f"hostApplications[{MAX_HOST_APPLICATIONS}:]: {len(raw) - MAX_HOST_APPLICATIONS} entries past the first "
            f"{MAX_HOST_APPLICATIONS} are not measured"
        )
    return tuple(apps), refused


def host_app(entry: object) -> HostApp:
    """One hostApplications entry checked; Refused says why it cannot be measured."""
    if not isinstance(entry, Mapping):
        raise Refused(f"the entry is a {type(entry).__name__}, not an object")
    raw_name = entry.get("name")
    if not isinstance(raw_name, str):
        raise Refused(f"name is {'missing' if raw_name is None else 'not a string'}")
    try:
        name = names.host_application_name(raw_name, "name")
    except names.InvalidName as e:
        raise Refused(str(e)) from None
    priority = cast(PriorityClassName, _choice(entry, "priority", _PRIORITIES))
    qos = cast(QoSClassName, _choice(entry, "qos", _QOS_CLASSES))
    cgroup_path = entry.get("cgroupPath")
    if cgroup_path is None:
        default_dir = _DEFAULT_DIR.get(qos, "")
        path = f"{default_dir}/{name}" if default_dir else name
        return HostApp(name=name, priority=priority, qos=qos, base=ROOT, path=path)
    if not isinstance(cgroup_path, Mapping):
        raise Refused(f"cgroupPath is a {type(cgroup_path).__name__}, not an object")
    base_name = cgroup_path.get("base", "")
    if not isinstance(base_name, str) or base_name not in _BASES:
        raise Refused(f"cgroupPath.base {_shown(base_name)} is none of {', '.join(b for b in _BASES if b)}")
    parts = [_relative_path(cgroup_path, field) for field in ("parentDir", "relativePath")]
    path = "/".join(part for part in parts if part)
    if not path:
        raise Refused(
            "cgroupPath names no directory below its base (parentDir and relativePath are empty): that is not one "
            "application's cgroup"
        )
    if len(path) > MAX_PATH_LENGTH:
        raise Refused(f"cgroupPath is {len(path)} characters long; at most {MAX_PATH_LENGTH}")
    return HostApp(name=name, priority=priority, qos=qos, base=_BASES[base_name], path=path)


def _shown(value: object) -> str:
    return names.shown(value) if isinstance(value, str) else f"{type(value).__name__} {names.shown(repr(value))}"


def _choice(entry: Mapping[str, object], field: str, allowed: frozenset[str]) -> str:
    value = entry.get(field, "")
    if value is None:
        return ""
    if not isinstance(value, str) or value not in allowed:
        raise Refused(f"{field} {_shown(value)} is none of Koordinator's: {', '.join(sorted(a for a in allowed if a))}")
    return value


def _relative_path(cgroup_path: Mapping[str, object], field: str) -> str:
    value = cgroup_path.get(field, "")
    if value is None:
        return ""
    if not isinstance(value, str):
        raise Refused(f"cgroupPath.{field} {_shown(value)} is not a string")
    if len(value) > MAX_PATH_LENGTH:
        raise Refused(f"cgroupPath.{field} is {len(value)} characters long; at most {MAX_PATH_LENGTH}")
    try:
        path = core.validate_parent(value)
    except core.AgentNameError:
        raise Refused(
            f"cgroupPath.{field} {names.shown(value)} must be a relative path of plain names (letters, digits, "
            "'_', '.', ':', '@', '-'; no leading '/', no '.' or '..', no empty parts)"
        ) from None
    if any(len(part) > _MAX_PART for part in path.split("/")):
        raise Refused(f"cgroupPath.{field} has a part longer than {_MAX_PART} characters")
    return path


def cgroup_dir(app: HostApp, *, driver: str, kubepods_parent: str) -> str | None:
    """The application's cgroup directory relative to each hierarchy's root; None when its base is a kubepods
    directory and the kubelet's (its driver) is not known yet."""
    if app.base == ROOT:
        return app.path
    if driver not in ("cgroupfs", "systemd"):
        return None
    known: core.Driver = "systemd" if driver == "systemd" else "cgroupfs"
    parts = (kubepods_parent, core.KUBEPODS_DIR[known], core.qos_dir(known, app.base), app.path)
    return "/".join(part for part in parts if part)
