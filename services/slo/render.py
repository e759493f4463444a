"""NodeSLO rendering (spec §7.1): the `slo-controller-config` keys in, each node's NodeSLO spec out.

Pure. For the threshold, QoS, burst and system keys: a missing key gives the manager's default; the key's JSON is
`{clusterStrategy, nodeStrategies: [{name, nodeSelector, <fields>}]}`; the cluster strategy is the default overlaid
with `clusterStrategy`, each node strategy the cluster strategy overlaid with the entry's fields, and a node takes
the first entry whose selector matches its labels. `host-application-config` is `{applications, nodeConfigs}`
with no merging: a matching node entry replaces the list. The node annotation `node.koordinator.sh/network-bandwidth`
overrides `systemStrategy.totalNetworkBandwidth`.

A key that does not parse, has a wrong type or an out-of-range value keeps its last good value (the default when
there is none) and its error is reported in `SloConfig.errors`: Koordinator keeps the previous value on a parse
error and leaves ranges to its webhook; we also refuse out-of-range values here, so no NodeSLO we write can fail the
CRD's bounds. Decoding follows Go's encoding/json as Koordinator uses it: unknown fields are dropped, field names
match case-insensitively, `null` means absent. Overlay follows Koordinator's MergeCfg: objects merge by key, other
values replace, an empty list is dropped (so the base keeps its list).
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from schemas.jsonmerge import overlay
from schemas.selectors import LabelSelector, selector_matches, selector_problems

ANNOTATION_NETWORK_BANDWIDTH: Final = "node.koordinator.sh/network-bandwidth"
HOST_APPLICATION_KEY: Final = "host-application-config"
HOST_APPLICATIONS_SPEC_FIELD: Final = "hostApplications"

_INT64: Final = (-(2**63), 2**63 - 1)
_INT32: Final = (-(2**31), 2**31 - 1)
_PERCENT: Final = (0, 100)
_QUANTITY: Final = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)

FieldKind = Any
"""What a field may hold: an integer range `(low, high)` (inclusive); "bool", "string", "quantity" (an integer or a
Kubernetes quantity string), "bool-map" or "object" (any JSON object, kept as given); a mapping of field names to
kinds (a nested object whose other fields are dropped); or ListOf such a mapping. Ranges are the NodeSLO CRD's
bounds, plus the spec's where the CRD has none (groupIdentity, schedIdle, watermarkScaleFactor)."""


class ListOf(msgspec.Struct, frozen=True):
    """A list of objects with these fields."""

    item: Mapping[str, FieldKind]


_CPU_QOS: Final[Mapping[str, FieldKind]] = {
    "enable": "bool",
    "groupIdentity": (-1, 2),
    "schedIdle": (0, 1),
    "coreExpeller": "bool",
}
_MEMORY_QOS: Final[Mapping[str, FieldKind]] = {
    "enable": "bool",
    "minLimitPercent": (0, _INT64[1]),
    "lowLimitPercent": (0, _INT64[1]),
    "throttlingPercent": (0, _INT64[1]),
    "wmarkRatio": (0, 100),
    "wmarkScalePermill": (1, 1000),
    "wmarkMinAdj": (-25, 50),
    "priorityEnable": _INT64,
    "priority": _INT64,
    "oomKillGroup": _INT64,
    "pageCacheEnable": "bool",
    "pageCacheLimitPercent": (0, 100),
    "pageCacheLimitSize": _INT64,
    "pageCacheReclaimSync": "bool",
}
_RESCTRL_QOS: Final[Mapping[str, FieldKind]] = {
    "enable": "bool",
    "catRangeStartPercent": (0, 100),
    "catRangeEndPercent": (0, 100),
    "mbaPercent": (0, 100),
}
_IO_CFG: Final[Mapping[str, FieldKind]] = {
    "readIOPS": (0, _INT64[1]),
    "writeIOPS": (0, _INT64[1]),
    "readBPS": (0, _INT64[1]),
    "writeBPS": (0, _INT64[1]),
    "ioWeightPercent": (1, 100),
    "readLatency": _INT64,
    "writeLatency": _INT64,
    "readLatencyPercent": (0, 100),
    "writeLatencyPercent": (0, 100),
    "enableUserModel": "bool",
    "modelReadBPS": (1, _INT64[1]),
    "modelWriteBPS": (1, _INT64[1]),
    "modelReadSeqIOPS": (1, _INT64[1]),
    "modelWriteSeqIOPS": (1, _INT64[1]),
    "modelReadRandIOPS": (1, _INT64[1]),
    "modelWriteRandIOPS": (1, _INT64[1]),
}
_BLKIO_QOS: Final[Mapping[str, FieldKind]] = {
    "enable": "bool",
    "blocks": ListOf({"name": "string", "type": "string", "ioCfg": _IO_CFG}),
}
_NETWORK_QOS: Final[Mapping[str, FieldKind]] = {
    "enable": "bool",
    "ingressRequest": "quantity",
    "ingressLimit": "quantity",
    "egressRequest": "quantity",
    "egressLimit": "quantity",
}
_RESOURCE_QOS: Final[Mapping[str, FieldKind]] = {
    "cpuQOS": _CPU_QOS,
    "memoryQOS": _MEMORY_QOS,
    "resctrlQOS": _RESCTRL_QOS,
    "blkioQOS": _BLKIO_QOS,
    "networkQOS": _NETWORK_QOS,
}


class SloKey(msgspec.Struct, frozen=True, kw_only=True):
    """One strategy key of the ConfigMap: where it lands in the NodeSLO spec, its default and its fields."""

    config_key: str
    spec_field: str
    default: Mapping[str, Any]
    fields: Mapping[str, FieldKind]


STRATEGY_KEYS: Final = (
    SloKey(
        config_key="resource-threshold-config",
        spec_field="resourceUsedThresholdWithBE",
        default={
            "enable": False,
            "cpuSuppressThresholdPercent": 65,
            "cpuSuppressPolicy": "cpuset",
            "memoryEvictThresholdPercent": 70,
            "cpuEvictPolicy": "evictByRealLimit",
        },
        fields={
            "enable": "bool",
            "cpuSuppressThresholdPercent": _PERCENT,
            "cpuSuppressMinPercent": _PERCENT,
            "cpuSuppressPolicy": "string",
            "memoryEvictThresholdPercent": _PERCENT,
            "memoryEvictLowerPercent": _PERCENT,
            "cpuEvictThresholdPercent": _PERCENT,
            "cpuEvictLowerPercent": _PERCENT,
            "cpuEvictPolicy": "string",
            "cpuEvictBESatisfactionLowerPercent": _INT64,
            "cpuEvictBESatisfactionUpperPercent": _INT64,
            "cpuEvictBEUsageThresholdPercent": _INT64,
            "cpuEvictTimeWindowSeconds": _INT64,
            "cpuAllocatableEvictThresholdPercent": (0, _INT64[1]),
            "cpuAllocatableEvictLowerPercent": (0, _INT64[1]),
            "memoryAllocatableEvictThresholdPercent": (0, _INT64[1]),
            "memoryAllocatableEvictLowerPercent": (0, _INT64[1]),
            "allocatableEvictPriorityThreshold": _INT32,
            "evictEnabledPriorityThreshold": _INT32,
        },
    ),
    SloKey(
        config_key="resource-qos-config",
        spec_field="resourceQOSStrategy",
        default={},
        fields={
            "policies": {"cpuPolicy": "string", "netQOSPolicy": "string"},
            "lsrClass": _RESOURCE_QOS,
            "lsClass": _RESOURCE_QOS,
            "beClass": _RESOURCE_QOS,
            "systemClass": _RESOURCE_QOS,
            "cgroupRoot": {"blkioQOS": _BLKIO_QOS},
        },
    ),
    SloKey(
        config_key="cpu-burst-config",
        spec_field="cpuBurstStrategy",
        default={
            "policy": "none",
            "cpuBurstPercent": 1000,
            "cfsQuotaBurstPercent": 300,
            "cfsQuotaBurstPeriodSeconds": -1,
            "sharePoolThresholdPercent": 50,
        },
        fields={
            "policy": "string",
            "cpuBurstPercent": (0, 10000),
            "cfsQuotaBurstPercent": _INT64,
            "cfsQuotaBurstPeriodSeconds": _INT64,
            "sharePoolThresholdPercent": _INT64,
        },
    ),
    SloKey(
        config_key="system-config",
        spec_field="systemStrategy",
        default={"totalNetworkBandwidth": 0},
        fields={
            "minFreeKbytesFactor": _INT64,
            "watermarkScaleFactor": (_INT64[0], 400),
            "memcgReapBackGround": _INT64,
            "schedGroupIdentityEnabled": _INT64,
            "schedIdleSaverWmark": _INT64,
            "schedFeatures": "bool-map",
            "pageCacheLimitEnabled": _INT64,
            "totalNetworkBandwidth": "quantity",
        },
    ),
)
HOST_APPLICATION_FIELDS: Final[Mapping[str, FieldKind]] = {
    "name": "string",
    "priority": "string",
    "qos": "string",
    "strategy": "object",
    "cgroupPath": {"base": "string", "parentDir": "string", "relativePath": "string"},
}
"""The fields of one `hostApplications` entry (also the NodeSLO CRD's, generated by koordbus.crds)."""


class SloConfigError(ValueError):
    """A ConfigMap key that cannot be used; the message names the JSON path."""


class NodeStrategy(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    node_selector: LabelSelector
    strategy: Mapping[str, Any]


class StrategyConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One key parsed: the cluster strategy and the node strategies, each already merged."""

    cluster: Mapping[str, Any]
    nodes: tuple[NodeStrategy, ...] = ()


class HostApplicationNodeConfig(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    node_selector: LabelSelector
    applications: tuple[Mapping[str, Any], ...]


class HostApplicationConfig(msgspec.Struct, frozen=True, kw_only=True):
    applications: tuple[Mapping[str, Any], ...] = ()
    nodes: tuple[HostApplicationNodeConfig, ...] = ()


class SloConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The whole ConfigMap parsed; `errors` maps a key to why its last good value (or default) is in use."""

    strategies: Mapping[str, StrategyConfig]
    host_applications: HostApplicationConfig = msgspec.field(default_factory=HostApplicationConfig)
    errors: Mapping[str, str] = msgspec.field(default_factory=dict)


def default_config() -> SloConfig:
    return SloConfig(strategies={key.config_key: StrategyConfig(cluster=dict(key.default)) for key in STRATEGY_KEYS})


def parse_slo_config(data: Mapping[str, str], previous: SloConfig | None = None) -> SloConfig:
    """The ConfigMap's data; a key in error keeps its value from `previous` (the default when None)."""
    base = previous or default_config()
    strategies: dict[str, StrategyConfig] = {}
    errors: dict[str, str] = {}
    for key in STRATEGY_KEYS:
        text = data.get(key.config_key)
        try:
            strategies[key.config_key] = parse_strategy(key, text)
        except SloConfigError as err:
            errors[key.config_key] = str(err)
            strategies[key.config_key] = base.strategies[key.config_key]
    try:
        host_applications = parse_host_applications(data.get(HOST_APPLICATION_KEY))
    except SloConfigError as err:
        errors[HOST_APPLICATION_KEY] = str(err)
        host_applications = base.host_applications
    return SloConfig(strategies=strategies, host_applications=host_applications, errors=errors)


def parse_strategy(key: SloKey, text: str | None) -> StrategyConfig:
    """One strategy key's JSON text; None or "" gives the default."""
    document = _document(text)
    cluster = overlay(key.default, _fields(document.get("clusterStrategy"), key.fields, "$.clusterStrategy"))
    nodes = []
    for index, entry in enumerate(_entries(document, "nodeStrategies")):
        path = f"$.nodeStrategies[{index}]"
        selector = _selector(entry, path)
        patch = _fields(entry, key.fields, path)
        nodes.append(NodeStrategy(name=_name(entry, path), node_selector=selector, strategy=overlay(cluster, patch)))
    return StrategyConfig(cluster=cluster, nodes=tuple(nodes))


def parse_host_applications(text: str | None) -> HostApplicationConfig:
    document = _document(text)
    applications = _applications(document.get("applications"), "$.applications")
    nodes = []
    for index, entry in enumerate(_entries(document, "nodeConfigs")):
        path = f"$.nodeConfigs[{index}]"
        listed = _folded(entry, ("applications",)).get("applications")
        nodes.append(
            HostApplicationNodeConfig(
                name=_name(entry, path),
                node_selector=_selector(entry, path),
                applications=_applications(listed, f"{path}.applications"),
            )
        )
    return HostApplicationConfig(applications=applications, nodes=tuple(nodes))


def render_node_slo(config: SloConfig, labels: Mapping[str, str], annotations: Mapping[str, str]) -> dict[str, Any]:
    """The NodeSLO spec for a node with these labels and annotations (a fresh copy the caller may change)."""
    spec: dict[str, Any] = {}
    for key in STRATEGY_KEYS:
        parsed = config.strategies[key.config_key]
        chosen = next(
            (node.strategy for node in parsed.nodes if selector_matches(node.node_selector, labels)), parsed.cluster
        )
        spec[key.spec_field] = copy.deepcopy(dict(chosen))
    bandwidth = annotations.get(ANNOTATION_NETWORK_BANDWIDTH)
    if bandwidth is not None and _QUANTITY.match(bandwidth):
        spec["systemStrategy"]["totalNetworkBandwidth"] = bandwidth
    hosts = config.host_applications
    applications = next(
        (node.applications for node in hosts.nodes if selector_matches(node.node_selector, labels)), hosts.applications
    )
    if applications:
        spec[HOST_APPLICATIONS_SPEC_FIELD] = copy.deepcopy([dict(app) for app in applications])
    return spec


# --- decoding


def _document(text: str | None) -> dict[str, Any]:
    if not text:
        return {}
    try:
        decoded = msgspec.json.decode(text)
    except msgspec.DecodeError as err:
        raise SloConfigError(f"$: not JSON: {err}") from None
    if decoded is None:
        return {}
    if not isinstance(decoded, dict):
        raise SloConfigError(f"$: expected a JSON object, got {type(decoded).__name__}")
    return _folded(decoded, ("clusterStrategy", "nodeStrategies", "applications", "nodeConfigs"))


def _folded(obj: Mapping[str, Any], names: Any) -> dict[str, Any]:
    """Keep the known keys, matched case-insensitively as Go does (exact name first, else the last other-case one)."""
    by_lower = {name.lower(): name for name in names}
    folded: dict[str, Any] = {}
    exact: set[str] = set()
    for key, value in obj.items():
        name = by_lower.get(key.lower())
        if name is None or (name in exact and key != name):
            continue
        if key == name:
            exact.add(name)
        folded[name] = value
    return folded


def _entries(document: Mapping[str, Any], name: str) -> list[dict[str, Any]]:
    value = document.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(entry, dict) for entry in value):
        raise SloConfigError(f"$.{name}: expected a list of objects")
    return value


def _name(entry: Mapping[str, Any], path: str) -> str:
    name = _folded(entry, ("name",)).get("name")
    if name is None:
        return ""
    if not isinstance(name, str):
        raise SloConfigError(f"{path}.name: expected a string")
    return name


def _selector(entry: Mapping[str, Any], path: str) -> LabelSelector:
    raw = _folded(entry, ("nodeSelector",)).get("nodeSelector")
    if not raw:
        raise SloConfigError(f"{path}.nodeSelector: required and must not be empty")
    try:
        selector = msgspec.convert(raw, LabelSelector)
    except msgspec.ValidationError as err:
        raise SloConfigError(f"{path}.nodeSelector: {err}") from None
    problems = selector_problems(selector)
    if problems:
        raise SloConfigError(f"{path}.nodeSelector: {'; '.join(problems)}")
    return selector


def _applications(value: Any, path: str) -> tuple[Mapping[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise SloConfigError(f"{path}: expected a list")
    return tuple(_fields(app, HOST_APPLICATION_FIELDS, f"{path}[{index}]") for index, app in enumerate(value))


def _fields(value: Any, fields: Mapping[str, FieldKind], path: str) -> dict[str, Any]:
    """A strategy object: known fields only (case-insensitively), each checked against its kind; nulls dropped."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise SloConfigError(f"{path}: expected a JSON object")
    checked: dict[str, Any] = {}
    for name, field_value in _folded(value, fields).items():
        if field_value is not None:
            checked[name] = _checked(field_value, fields[name], f"{path}.{name}")
    return checked


def _checked(value: Any, kind: FieldKind, path: str) -> Any:
    if isinstance(kind, Mapping):
        return _fields(value, kind, path)
    if isinstance(kind, ListOf):
        if not isinstance(value, list):
            raise SloConfigError(f"{path}: expected a list, got {value!r}")
        return [_fields(item, kind.item, f"{path}[{index}]") for index, item in enumerate(value)]
    if isinstance(kind, tuple):
        if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
            raise SloConfigError(f"{path}: expected an integer, got {value!r}")
        if not kind[0] <= value <= kind[1]:
            raise SloConfigError(f"{path}: {value} is out of range [{kind[0]}, {kind[1]}]")
        return int(value)
    expected: dict[str, bool] = {
        "bool": isinstance(value, bool),
        "string": isinstance(value, str),
        "object": isinstance(value, Mapping),
        "bool-map": isinstance(value, Mapping) and all(isinstance(v, bool) for v in value.values()),
        "quantity": (isinstance(value, int) and not isinstance(value, bool))
        or (isinstance(value, str) and bool(_QUANTITY.match(value))),
    }
    if not expected[kind]:
        raise SloConfigError(f"{path}: expected {kind}, got {value!r}")
    return value
