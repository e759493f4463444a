"""The `slo-controller-config` ConfigMap (spec §7.1): its name, its keys and how each is read, as Koordinator's
manager (pkg/slo-controller) reads them. Pure.

For the threshold, QoS, burst and system keys: a missing key (or no ConfigMap) gives the manager's default; the
key's JSON is `{clusterStrategy, nodeStrategies: [{name, nodeSelector, <fields>}]}`; the cluster strategy is the
default MergeCfg'd with `clusterStrategy`, each node strategy the cluster strategy MergeCfg'd with the entry's
fields (an entry with none is a copy), and a node takes the first entry whose selector matches its labels
(`first_match`: an entry without a selector matches no node, `{}` every node, an invalid one is skipped).
`host-application-config` is `{applications, nodeConfigs}` with no merging: a matching node entry replaces the list.

Decoding, re-encoding and MergeCfg are Go's encoding/json (services.common.gojson): unknown fields dropped, names
matched case-insensitively, `null` and Go's zero values absent, a non-pointer Quantity always present (so a system
overlay without `totalNetworkBandwidth` sets it to 0, as in Koordinator), quantities output as their integer
Value(). A key that fails to decode (not JSON, "", a wrong type) keeps its last good value (`previous`; the
default when there is none) and its problems are reported in `SloConfig.errors`, as Koordinator keeps its previous
value on an unmarshal error. One deliberate difference: Koordinator leaves ranges to its webhook, we also refuse
an out-of-range value (or a null list item) here, the same way, so no NodeSLO we write can fail the CRD's bounds.

Shared by the three deciders that read this ConfigMap: node QoS (services.slo renders each node's NodeSLO from
`parse_slo_config`), and the load-aware scheduler and the descheduler (services.common.watermarks reads
`resource-threshold-config` with `parse_strategy`); koordbus.crds builds the NodeSLO CRD's schema from the tables.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Final

import msgspec

from schemas.selectors import LabelSelector, selector_matches
from services.common import gojson
from services.common.gojson import INLINE, UNSET, Inline, ListOf, ValueStruct

CONFIGMAP_NAMESPACE: Final = "koordinator-system"
CONFIGMAP_NAME: Final = "slo-controller-config"
"""Where the ConfigMap is unless a service is configured otherwise."""
HOST_APPLICATION_KEY: Final = "host-application-config"

_INT64: Final = (-(2**63), 2**63 - 1)
_INT32: Final = (-(2**31), 2**31 - 1)
_PERCENT: Final = (0, 100)

FieldKind = gojson.Kind
"""A field's Go type (services.common.gojson.Kind). Integer ranges are the NodeSLO CRD's bounds, plus the spec's where
the CRD has none (groupIdentity, schedIdle, watermarkScaleFactor); tables list fields in Go's declaration order."""

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
    "blocks": ListOf({"name": "string", "type": "string", "ioCfg": ValueStruct(_IO_CFG)}),
}
_NETWORK_QOS: Final[Mapping[str, FieldKind]] = {
    "enable": "bool",
    "ingressRequest": "int-or-string",
    "ingressLimit": "int-or-string",
    "egressRequest": "int-or-string",
    "egressLimit": "int-or-string",
}
_RESOURCE_QOS: Final[Mapping[str, FieldKind]] = {
    "cpuQOS": _CPU_QOS,
    "memoryQOS": _MEMORY_QOS,
    "blkioQOS": _BLKIO_QOS,
    "resctrlQOS": _RESCTRL_QOS,
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
            "memoryAllocatableEvictThresholdPercent": (0, _INT64[1]),
            "memoryAllocatableEvictLowerPercent": (0, _INT64[1]),
            "cpuEvictBESatisfactionUpperPercent": _INT64,
            "cpuEvictBESatisfactionLowerPercent": _INT64,
            "cpuEvictBEUsageThresholdPercent": _INT64,
            "cpuEvictTimeWindowSeconds": _INT64,
            "cpuEvictThresholdPercent": _PERCENT,
            "cpuEvictLowerPercent": _PERCENT,
            "cpuAllocatableEvictThresholdPercent": (0, _INT64[1]),
            "cpuAllocatableEvictLowerPercent": (0, _INT64[1]),
            "cpuEvictPolicy": "string",
            "evictEnabledPriorityThreshold": _INT32,
            "allocatableEvictPriorityThreshold": _INT32,
        },
    ),
    SloKey(
        config_key="resource-qos-config",
        spec_field="resourceQOSStrategy",
        default={},
        fields={
            "policies": {"cpuPolicy": "string-pointer", "netQOSPolicy": "string-pointer"},
            "lsrClass": _RESOURCE_QOS,
            "lsClass": _RESOURCE_QOS,
            "beClass": _RESOURCE_QOS,
            "systemClass": _RESOURCE_QOS,
            "cgroupRoot": _RESOURCE_QOS,
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
    "cgroupPath": {"base": "string", "parentDir": "string", "relativePath": "string"},
    "strategy": "empty-object",
}
"""The fields of one `hostApplications` entry (also the NodeSLO CRD's, generated by koordbus.crds)."""

_SELECTOR: Final[Mapping[str, FieldKind]] = {
    "matchLabels": "string-map",
    "matchExpressions": ListOf(
        {"key": "string", "operator": "string", "values": ListOf("string", pointers=False)}, pointers=False
    ),
}
_NODE_PROFILE: Final[Mapping[str, FieldKind]] = {"name": "string", "nodeSelector": _SELECTOR}
"""Koordinator's NodeCfgProfile, inlined in every nodeStrategies / nodeConfigs entry."""
_HOST_APPLICATION_DOCUMENT: Final = ValueStruct(
    {
        "applications": ListOf(HOST_APPLICATION_FIELDS, pointers=False),
        "nodeConfigs": ListOf(
            {**_NODE_PROFILE, "applications": ListOf(HOST_APPLICATION_FIELDS, pointers=False)}, pointers=False
        ),
    }
)


def _strategy_document(key: SloKey) -> ValueStruct:
    """The Go type a strategy key decodes into: `{clusterStrategy *T, nodeStrategies []{NodeCfgProfile, *T}}`."""
    return ValueStruct(
        {"clusterStrategy": key.fields, "nodeStrategies": ListOf(Inline(_NODE_PROFILE, key.fields), pointers=False)}
    )


class SloConfigError(ValueError):
    """A ConfigMap key that cannot be used: each problem names its JSON path within the key's JSON."""

    def __init__(self, problems: list[gojson.Problem]) -> None:
        self.problems = tuple(problems)
        super().__init__("; ".join(str(problem) for problem in self.problems))


class NodeStrategy(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    node_selector: LabelSelector | None
    """None: the entry has no selector and matches no node."""
    strategy: Mapping[str, Any]


class StrategyConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One key parsed: the cluster strategy and the node strategies, each already merged (as Go encodes them)."""

    cluster: Mapping[str, Any]
    nodes: tuple[NodeStrategy, ...] = ()


class HostApplicationNodeConfig(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    node_selector: LabelSelector | None
    applications: tuple[Mapping[str, Any], ...]


class HostApplicationConfig(msgspec.Struct, frozen=True, kw_only=True):
    applications: tuple[Mapping[str, Any], ...] = ()
    nodes: tuple[HostApplicationNodeConfig, ...] = ()


class SloConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The whole ConfigMap parsed; `errors` maps a key to why its last good value (or default) is in use."""

    strategies: Mapping[str, StrategyConfig]
    host_applications: HostApplicationConfig = msgspec.field(default_factory=HostApplicationConfig)
    errors: Mapping[str, str] = msgspec.field(default_factory=dict)
    problems: Mapping[str, tuple[gojson.Problem, ...]] = msgspec.field(default_factory=dict)
    """Key → each problem found in it (JSON path and reason); `errors` joins them."""


def default_config() -> SloConfig:
    return SloConfig(strategies={key.config_key: StrategyConfig(cluster=dict(key.default)) for key in STRATEGY_KEYS})


def parse_slo_config(data: Mapping[str, str] | None, previous: SloConfig | None = None) -> SloConfig:
    """The ConfigMap's data (None: no ConfigMap); a key in error keeps its value from `previous` (the default when
    None), as Koordinator keeps the config it had processed before."""
    base = previous or default_config()
    data = data or {}
    strategies: dict[str, StrategyConfig] = {}
    problems: dict[str, tuple[gojson.Problem, ...]] = {}
    for key in STRATEGY_KEYS:
        try:
            strategies[key.config_key] = parse_strategy(key, data.get(key.config_key))
        except SloConfigError as err:
            problems[key.config_key] = err.problems
            strategies[key.config_key] = base.strategies[key.config_key]
    try:
        host_applications = parse_host_applications(data.get(HOST_APPLICATION_KEY))
    except SloConfigError as err:
        problems[HOST_APPLICATION_KEY] = err.problems
        host_applications = base.host_applications
    errors = {key: "; ".join(str(p) for p in found) for key, found in problems.items()}
    return SloConfig(strategies=strategies, host_applications=host_applications, errors=errors, problems=problems)


def _decode(text: str, kind: FieldKind) -> dict[str, Any]:
    """The key's text decoded into its Go type; SloConfigError with every problem found."""
    try:
        document = gojson.parse(text)
    except gojson.GoJsonError as err:
        raise SloConfigError([gojson.Problem("$", str(err))]) from None
    problems: list[gojson.Problem] = []
    decoded = gojson.decode_onto(UNSET, document, kind, "$", problems)
    if problems:
        raise SloConfigError(problems)
    return {} if decoded is UNSET else dict(decoded)


def parse_strategy(key: SloKey, text: str | None) -> StrategyConfig:
    """One strategy key's JSON text; None (the key is absent) gives the default, "" does not parse."""
    if text is None:
        return StrategyConfig(cluster=dict(key.default))
    document = _decode(text, _strategy_document(key))
    given = document.get("clusterStrategy", UNSET)
    cluster = dict(key.default) if given is UNSET else gojson.merge(key.default, given, key.fields)
    nodes = []
    for entry in document.get("nodeStrategies", ()):
        fields = entry.get(INLINE, UNSET)
        strategy = copy.deepcopy(cluster) if fields is UNSET else gojson.merge(cluster, fields, key.fields)
        nodes.append(NodeStrategy(name=entry.get("name", ""), node_selector=_selector(entry), strategy=strategy))
    return StrategyConfig(cluster=cluster, nodes=tuple(nodes))


def parse_host_applications(text: str | None) -> HostApplicationConfig:
    """The `host-application-config` key's JSON text; None (the key is absent) gives no applications."""
    if text is None:
        return HostApplicationConfig()
    document = _decode(text, _HOST_APPLICATION_DOCUMENT)
    nodes = tuple(
        HostApplicationNodeConfig(
            name=entry.get("name", ""), node_selector=_selector(entry), applications=_apps(entry.get("applications"))
        )
        for entry in document.get("nodeConfigs", ())
    )
    return HostApplicationConfig(applications=_apps(document.get("applications")), nodes=nodes)


def _apps(listed: Any) -> tuple[Mapping[str, Any], ...]:
    return tuple(gojson.encode(app, HOST_APPLICATION_FIELDS) for app in listed or ())


def _selector(entry: Mapping[str, Any]) -> LabelSelector | None:
    raw = entry.get("nodeSelector", UNSET)
    return None if raw is UNSET else msgspec.convert(raw, LabelSelector)


def first_match(selectors: list[LabelSelector | None], labels: Mapping[str, str]) -> int | None:
    """The index of the first selector that matches the labels (absent or invalid ones never do); None: none."""
    return next((index for index, selector in enumerate(selectors) if selector_matches(selector, labels)), None)
