"""MigrationControllerArgs (spec §4.3): the arbitration and eviction settings with Koordinator's defaults. Pure.

The struct decodes Koordinator's JSON/YAML names (`maxMigratingPerNode`, `objectLimiters`, …), so a descheduler
config can be reused as is. An omitted limit takes Koordinator's default; an explicit 0 disables it (the limits
are checked only when > 0). `get_max_unavailable` is Koordinator's GetMaxUnavailable, also used for maxMigrating.
The document is read, and its errors raised, as every service's args are (services.common.args). Used by
services.migration.filters/arbiter, `koordbus calc arbitrate` and the migration service.
"""

from __future__ import annotations

import math
import re
from typing import Final

import msgspec

from schemas.k8s_verbs import DeleteOptions
from schemas.migration import MODE_RESERVATION_FIRST
from schemas.selectors import LabelSelector
from services.common import args as common_args
from services.common.args import ArgsError

IntOrPercent = int | str
_PERCENT = re.compile(r"^(\d+)%$")

GATES: Final = frozenset(
    {
        "MaxUnavailablePerWorkload",
        "MaxMigratingPerWorkload",
        "MaxMigratingPerNode",
        "MaxMigratingPerNamespace",
        "MaxMigratingGlobally",
        "ExpectedReplicas",
        "PVC",
        "BarePods",
        "LocalStorage",
        "SystemCritical",
        "PriorityThreshold",
        "LabelSelector",
        "Namespaces",
        "NodeFit",
    }
)
"""The filters `skipEvictionGates` may switch off."""

EVICTION_POLICIES: Final = ("Eviction", "Delete", "SoftEviction")
"""Koordinator's evictors (pkg/descheduler/controllers/migration/evictor): the Eviction API, a DELETE, the
soft-eviction annotation."""


class PriorityThreshold(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    name: str = ""
    value: int | None = None


class Namespaces(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    include: list[str] = []
    exclude: list[str] = []


class ObjectLimiter(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    duration: str = ""
    """A Go duration ("5m")."""
    max_migrating: IntOrPercent | None = None
    burst: int = 0


class ArbitrationArgs(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    enabled: bool = True
    interval: str = "500ms"


def _default_limiters() -> dict[str, ObjectLimiter]:
    return {"workload": ObjectLimiter(duration="5m")}


class MigrationArgs(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    dry_run: bool = False
    evict_failed_bare_pods: bool = False
    evict_all_bare_pods: bool = False
    evict_local_storage_pods: bool = False
    evict_system_critical_pods: bool = False
    ignore_pvc_pods: bool = False
    priority_threshold: PriorityThreshold | None = None
    label_selector: LabelSelector | None = None
    namespaces: Namespaces | None = None
    node_fit: bool = False
    skip_eviction_gates: list[str] = []
    max_migrating_globally: int | None = None
    max_migrating_per_node: int | None = 2
    max_migrating_per_namespace: int | None = None
    max_migrating_per_workload: IntOrPercent | None = None
    max_unavailable_per_workload: IntOrPercent | None = None
    skip_check_expected_replicas: bool | None = None
    object_limiters: dict[str, ObjectLimiter] = msgspec.field(default_factory=_default_limiters)
    default_job_mode: str = MODE_RESERVATION_FIRST
    default_job_ttl: str = msgspec.field(default="5m", name="defaultJobTTL")
    scheduler_names: list[str] = msgspec.field(default_factory=lambda: ["koord-scheduler"])
    evict_qps: float = msgspec.field(default=10.0, name="evictQPS")
    evict_burst: int = 1
    eviction_policy: str = "Eviction"
    """How a passed job's pod is evicted (EVICTION_POLICIES); a pod's or job's `koordinator.sh/evict-policy` label
    overrides it per job (services.migration.evictors)."""
    default_delete_options: DeleteOptions | None = None
    """The delete options of a job whose spec has none."""
    arbitration_args: ArbitrationArgs = ArbitrationArgs()

    def gate_on(self, gate: str) -> bool:
        return gate not in self.skip_eviction_gates


def check_args(args: MigrationArgs) -> None:
    """Raise ArgsError for values Koordinator's validation refuses."""
    for name in ("max_migrating_globally", "max_migrating_per_node", "max_migrating_per_namespace"):
        value = getattr(args, name)
        if value is not None and value < 0:
            raise ArgsError(f"{_camel(name)} must not be negative, got {value}")
    for name in ("max_migrating_per_workload", "max_unavailable_per_workload"):
        value = getattr(args, name)
        if value is not None:
            scaled(value, 100, field=_camel(name))
    unknown = sorted(set(args.skip_eviction_gates) - GATES)
    if unknown:
        raise ArgsError(f"skipEvictionGates: unknown gate(s) {', '.join(unknown)} (known: {', '.join(sorted(GATES))})")
    if args.eviction_policy not in EVICTION_POLICIES:
        raise ArgsError(
            f"evictionPolicy: unknown policy {args.eviction_policy!r} (known: {', '.join(EVICTION_POLICIES)})"
        )
    if args.evict_qps <= 0 or args.evict_burst < 1:
        raise ArgsError("evictQPS must be positive and evictBurst at least 1")
    for kind, limiter in args.object_limiters.items():
        if kind not in ("workload", "namespace"):
            raise ArgsError(f"objectLimiters: unknown type {kind!r} (workload or namespace)")
        duration_seconds(limiter.duration, field=f"objectLimiters.{kind}.duration")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.capitalize() for part in rest)


def scaled(value: IntOrPercent, replicas: int, *, field: str = "value") -> int:
    """An int, or a percent of `replicas` rounded down (Kubernetes' GetScaledValueFromIntOrPercent)."""
    if isinstance(value, bool):
        raise ArgsError(f"{field} must be an integer or a percent, got {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ArgsError(f"{field} must not be negative, got {value}")
        return value
    match = _PERCENT.match(value)
    if match is None:
        raise ArgsError(f"{field} must be an integer or a percent like '10%', got {value!r}")
    return math.floor(replicas * int(match.group(1)) / 100)


def get_max_unavailable(replicas: int, value: IntOrPercent | None) -> int:
    """§4.3: the configured value scaled (0 becomes 1), else 10% above 10 replicas, 2 for 4–10, 1 below; at most
    `replicas`."""
    if value is None:
        if replicas > 10:
            result = math.floor(replicas * 10 / 100)
        elif replicas >= 4:
            result = 2
        else:
            result = 1
    else:
        result = scaled(value, replicas) or 1
    return min(result, replicas)


def duration_seconds(text: str, *, field: str = "duration") -> float:
    """A Go duration ("5m", "1h30m", "500ms"; services.common.args) in seconds, as the limiter, the job TTLs and the
    arbitration interval count them; "" or "0" is 0, a negative one is refused."""
    return float(common_args.duration_seconds(text, field=field, negative=False))


def load_args(text: str, *, source: str = "args") -> MigrationArgs:
    """MigrationControllerArgs from a JSON or YAML document (Koordinator's names); ArgsError names what is wrong."""
    document = common_args.load_document(text, source=source)
    args = common_args.convert(document, MigrationArgs, name="MigrationControllerArgs", source=source, strict=False)
    check_args(args)
    return args


def low_node_load_section(text: str, *, source: str = "args") -> dict[str, object]:
    """The `lowNodeLoad` section of an args document (koordbus's load-aware descheduling), {} when absent."""
    document = common_args.load_document(text, source=source)
    section = document.get("lowNodeLoad", {}) if isinstance(document, dict) else {}
    if not isinstance(section, dict):
        raise ArgsError(f"{source}: lowNodeLoad must be an object")
    return section
