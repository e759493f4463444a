"""Koordinator's `colocation-config` (spec §2.2): parsing, validation, cluster/node merging and the load algorithm.

Pure: text or decoded JSON in, frozen values out. Callers: the noderesource service (ColocationConfigState fed with
the `slo-controller-config` ConfigMap; node_strategy per node; metric_collect_policy for NodeMetric specs), the API
(config_to_json, the warnings on each nodeConfigs entry), `koordbus calc batch-resource`
(effective_strategy_from_json) and the webhook's validation of the ConfigMap (config_problems, which the
composition root hands services.webhook). Decoding follows Go's encoding/json as Koordinator uses it: unknown fields are
ignored, keys match field names case-insensitively, `null` means absent, a wrong type fails the whole document.
Merging follows Koordinator's MergeCfg: present fields win, nested objects merge, maps merge by key, lists replace
(an empty list is dropped, as Go's `omitempty` drops it, so it keeps the base list).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Final, TypeVar

import msgspec
import msgspec.inspect as msgspec_inspect

from schemas import koordinator, node
from schemas.selectors import LabelSelector, node_profile_problems, selector_matches, selector_problems
from services.noderesource import strategy as strategy_module
from services.noderesource.strategy import ColocationStrategy

CONFIGMAP_NAMESPACE: Final = "koordinator-system"
CONFIGMAP_NAME: Final = "slo-controller-config"
COLOCATION_CONFIG_KEY: Final = "colocation-config"
ANNOTATION_NODE_STRATEGY: Final = "node.koordinator.sh/colocation-strategy"
RATIO_LABELS: Final[Mapping[str, str]] = {
    "node.koordinator.sh/cpu-reclaim-ratio": "cpu_reclaim_threshold_percent",
    "node.koordinator.sh/memory-reclaim-ratio": "memory_reclaim_threshold_percent",
    "node.koordinator.sh/mid-static-cpu-reserved-ratio": "mid_static_cpu_reserved_percent",
    "node.koordinator.sh/mid-static-memory-reserved-ratio": "mid_static_memory_reserved_percent",
}
"""Node labels holding a float ratio that overrides a percentage of the strategy (as int(ratio × 100))."""

Int64 = Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)]
_INT64_MAX: Final = 2**63 - 1
_T = TypeVar("_T")
Problem = tuple[str, str]
"""(JSON path, reason), e.g. ("$.nodeConfigs[0].midCPUThresholdPercent", "must be between 0 and 100, got 150")."""


class ColocationConfigError(ValueError):
    """A colocation config Koordinator would reject; the message names each bad field by JSON path and its value.

    `malformed` is true when the document does not even decode in Go (not JSON, a wrong type, a bad duration), false
    when it decodes but breaks a §2.2 rule.
    """

    def __init__(self, problems: Iterable[Problem], *, malformed: bool = False) -> None:
        self.problems = tuple(problems)
        self.malformed = malformed
        super().__init__("; ".join(f"{path}: {reason}" for path, reason in self.problems))


# --- the JSON shapes (every strategy field optional: absent or null = "not set", as Go's pointers)


class AggregatePolicyJSON(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    durations: tuple[str, ...] | None = None


class StrategyOverrides(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    """The ColocationStrategy fields present in one JSON object (the cluster's, a nodeConfigs entry's, a node's)."""

    enable: bool | None = None
    metric_aggregate_duration_seconds: Int64 | None = None
    metric_report_interval_seconds: Int64 | None = None
    metric_aggregate_policy: AggregatePolicyJSON | None = None
    metric_memory_collect_policy: str | None = None
    cpu_reclaim_threshold_percent: Int64 | None = None
    cpu_calculate_policy: str | None = None
    memory_reclaim_threshold_percent: Int64 | None = None
    memory_calculate_policy: str | None = None
    degrade_time_minutes: Int64 | None = None
    update_time_threshold_seconds: Int64 | None = None
    resource_diff_threshold: float | None = None
    batch_cpu_threshold_percent: Int64 | None = msgspec.field(default=None, name="batchCPUThresholdPercent")
    batch_memory_threshold_percent: Int64 | None = None
    mid_reclaim_mode: str | None = None
    mid_cpu_threshold_percent: Int64 | None = msgspec.field(default=None, name="midCPUThresholdPercent")
    mid_memory_threshold_percent: Int64 | None = None
    mid_unallocated_percent: Int64 | None = None
    mid_static_cpu_reserved_percent: Int64 | None = msgspec.field(default=None, name="midStaticCPUReservedPercent")
    mid_static_memory_reserved_percent: Int64 | None = None
    extensions: dict[str, Any] | None = None


class NodeConfigJSON(StrategyOverrides, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    name: str | None = None
    node_selector: LabelSelector | None = None


class ColocationConfigJSON(StrategyOverrides, frozen=True, kw_only=True, omit_defaults=True, rename="camel"):
    node_configs: tuple[NodeConfigJSON, ...] | None = None


_CONFIG_TYPE_INFO: Final = msgspec_inspect.type_info(ColocationConfigJSON)
_OVERRIDES_TYPE_INFO: Final = msgspec_inspect.type_info(StrategyOverrides)
_JSON_NAMES: Final = {field.name: field.encode_name for field in msgspec.structs.fields(StrategyOverrides)}
_FIELD_ORDER: Final = {name: index for index, name in enumerate(_JSON_NAMES)}
_PLAIN_FIELDS: Final = tuple(name for name in _JSON_NAMES if name not in ("metric_aggregate_policy", "extensions"))


# --- the parsed config


class NodeColocationConfig(msgspec.Struct, frozen=True, kw_only=True):
    """One nodeConfigs entry: its selector and the cluster strategy merged with its fields.

    If that merge is invalid the entry keeps the cluster strategy, with the reason in `warnings` (as does a selector
    Kubernetes would refuse, which then matches no node).
    """

    name: str = ""
    node_selector: LabelSelector | None = None
    strategy: ColocationStrategy
    warnings: tuple[str, ...] = ()


class ClusterColocationConfig(msgspec.Struct, frozen=True, kw_only=True):
    strategy: ColocationStrategy = msgspec.field(default_factory=ColocationStrategy)
    node_configs: tuple[NodeColocationConfig, ...] = ()


def parse_colocation_config(text: str | None) -> ClusterColocationConfig:
    """The ConfigMap key's JSON text; None or "" gives the defaults (only exactly "", as Koordinator checks)."""
    if not text:
        return ClusterColocationConfig()
    try:
        decoded = msgspec.json.decode(text)
    except msgspec.DecodeError as err:
        raise ColocationConfigError([("$", f"not JSON: {err}")], malformed=True) from None
    return parse_colocation_object(decoded)


def parse_colocation_object(obj: Any) -> ClusterColocationConfig:
    """Like parse_colocation_config for an already decoded JSON value (None = JSON null = the defaults)."""
    if obj is None:
        return ClusterColocationConfig()
    raw = _decode(obj, ColocationConfigJSON, _CONFIG_TYPE_INFO)
    entries = raw.node_configs or ()
    syntax = _duration_syntax_problems(raw, "$")
    for index, entry in enumerate(entries):
        syntax += _duration_syntax_problems(entry, f"$.nodeConfigs[{index}]")
    if syntax:
        raise ColocationConfigError(syntax, malformed=True)
    cluster = merge_strategy(ColocationStrategy(), raw, path="$")
    return ClusterColocationConfig(
        strategy=cluster,
        node_configs=tuple(_node_config(cluster, entry, f"$.nodeConfigs[{i}]") for i, entry in enumerate(entries)),
    )


def _node_config(cluster: ColocationStrategy, entry: NodeConfigJSON, path: str) -> NodeColocationConfig:
    warnings = [f"{path}.nodeSelector: {reason}" for reason in selector_problems(entry.node_selector)]
    try:
        merged = merge_strategy(cluster, entry, path=path)
    except ColocationConfigError as err:
        merged = cluster
        warnings.append(f"invalid, the cluster strategy applies instead: {err}")
    return NodeColocationConfig(
        name=entry.name or "", node_selector=entry.node_selector, strategy=merged, warnings=tuple(warnings)
    )


WEBHOOK_MAX_RESOURCE_DIFF_THRESHOLD: Final = 1.0
"""Koordinator's webhook bound on resourceDiffThreshold (the strategy itself only needs it > 0)."""


def config_problems(text: str) -> list[Problem]:
    """What Koordinator's slo-controller-config webhook refuses in the key, each with its JSON path: what
    parse_colocation_config refuses; a nodeConfigs entry whose merge with the cluster strategy is invalid (the
    service would keep the cluster strategy for it) or whose nodeSelector is absent, empty or one Kubernetes
    refuses; a resourceDiffThreshold over WEBHOOK_MAX_RESOURCE_DIFF_THRESHOLD. [] when the key is good."""
    problems: list[Problem] = []
    try:
        cluster = parse_colocation_config(text).strategy
    except ColocationConfigError as err:
        if err.malformed:
            return list(err.problems)
        problems += err.problems
        cluster = ColocationStrategy()  # the entries are checked on their own fields
    decoded = msgspec.json.decode(text) if text else None
    if decoded is None:
        return problems
    raw = _decode(decoded, ColocationConfigJSON, _CONFIG_TYPE_INFO)
    for path, overrides in (("$", raw), *((f"$.nodeConfigs[{i}]", e) for i, e in enumerate(raw.node_configs or ()))):
        threshold = overrides.resource_diff_threshold
        if threshold is not None and threshold > WEBHOOK_MAX_RESOURCE_DIFF_THRESHOLD:
            reason = f"must be ≤ {WEBHOOK_MAX_RESOURCE_DIFF_THRESHOLD:g}, got {threshold!r}"
            problems.append((f"{path}.resourceDiffThreshold", reason))
    for index, entry in enumerate(raw.node_configs or ()):
        path = f"$.nodeConfigs[{index}]"
        problems += [(f"{path}.nodeSelector", reason) for reason in node_profile_problems(entry.node_selector)]
        try:
            merge_strategy(cluster, entry, path=path)
        except ColocationConfigError as err:
            problems += err.problems
    return problems


# --- decoding


def _decode(obj: Any, type_: type[_T], info: msgspec_inspect.Type) -> _T:
    if not isinstance(obj, Mapping):
        raise ColocationConfigError(
            [("$", f"expected a JSON object, got {type(obj).__name__} {_shown(obj)}")], malformed=True
        )
    folded = _canonical_keys(dict(obj), info)
    try:
        return msgspec.convert(folded, type_)
    except msgspec.ValidationError as err:
        raise ColocationConfigError([_validation_problem(str(err), folded)], malformed=True) from None


def _canonical_keys(value: Any, info: msgspec_inspect.Type) -> Any:
    """Rename object keys to our field names the way Go's encoding/json matches them.

    The exact name, else the same name in another case (`batchCpuThresholdPercent` sets batchCPUThresholdPercent);
    for a key given twice the later wins. Unknown keys are dropped; map keys (matchLabels, extensions) are data and
    stay as they are.
    """
    if isinstance(info, msgspec_inspect.UnionType):
        for member in info.types:
            if isinstance(member, msgspec_inspect.StructType | msgspec_inspect.VarTupleType):
                return _canonical_keys(value, member)
        return value
    if isinstance(info, msgspec_inspect.VarTupleType) and isinstance(value, list):
        return [_canonical_keys(item, info.item_type) for item in value]
    if isinstance(info, msgspec_inspect.StructType) and isinstance(value, Mapping):
        by_name = {field.encode_name: field for field in info.fields}
        by_folded = {field.encode_name.lower(): field for field in info.fields}
        out: dict[str, Any] = {}
        for key, item in value.items():
            field = by_name.get(key) or (by_folded.get(key.lower()) if isinstance(key, str) else None)
            if field is not None:
                out[field.encode_name] = _canonical_keys(item, field.type)
        return out
    return value


_MSGSPEC_PATH = re.compile(r"^(?P<reason>.*) - at `(?P<path>\$[^`]*)`$", re.DOTALL)
_PATH_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")


def _validation_problem(message: str, decoded: Any) -> Problem:
    """msgspec's "Expected `int`, got `str` - at `$.x`" as ($.x, "expected int, got str '12'")."""
    match = _MSGSPEC_PATH.match(message)
    if match is None:
        return ("$", message)
    path, reason = match["path"], match["reason"].replace("`", "")
    reason = reason[:1].lower() + reason[1:]
    value, pos = decoded, 1
    while pos < len(path):
        step = _PATH_STEP.match(path, pos)
        if step is None:
            return (path, reason)  # a map key, which msgspec writes as `[...]`
        try:
            value = value[step[1]] if step[1] is not None else value[int(step[2])]
        except (KeyError, IndexError, TypeError):
            return (path, reason)
        pos = step.end()
    return (path, f"{reason} {_shown(value)}")


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _duration_syntax_problems(overrides: StrategyOverrides, path: str) -> list[Problem]:
    """Go durations that do not parse: in Go that fails the JSON decoding itself, hence the whole document."""
    policy = overrides.metric_aggregate_policy
    problems: list[Problem] = []
    for index, text in enumerate((policy.durations or ()) if policy else ()):
        try:
            koordinator.parse_go_duration(text)
        except ValueError as err:
            problems.append((f"{path}.metricAggregatePolicy.durations[{index}]", str(err)))
    return problems


# --- merging and validation


def merge_strategy(base: ColocationStrategy, overrides: StrategyOverrides, *, path: str = "$") -> ColocationStrategy:
    """`base` with the fields present in `overrides`, validated.

    ColocationConfigError names the bad fields under `path`. Durations must already parse (the caller checks with
    _duration_syntax_problems, because in Go a bad one fails the whole document).
    """
    changes: dict[str, Any] = {}
    for name in _PLAIN_FIELDS:
        value = getattr(overrides, name)
        if value is not None:
            changes[name] = value
    problems: list[Problem] = []
    policy = overrides.metric_aggregate_policy
    if policy is not None and policy.durations:
        seconds = [koordinator.parse_go_duration(text) for text in policy.durations]
        for index, (text, value) in enumerate(zip(policy.durations, seconds, strict=True)):
            if value <= 0 or value.denominator != 1:
                reason = f"must be a positive whole number of seconds, got {text!r}"
                problems.append((f"{path}.metricAggregatePolicy.durations[{index}]", reason))
        if not problems:
            changes["metric_aggregate_durations_seconds"] = tuple(int(value) for value in seconds)
    if overrides.extensions:
        changes["extensions"] = {**base.extensions, **overrides.extensions}
    merged = msgspec.structs.replace(base, **changes)
    problems += [(f"{path}.{_JSON_NAMES[name]}", reason) for name, reason in strategy_problems(merged)]
    if problems:
        raise ColocationConfigError(problems)
    return merged


_MEMORY_COLLECT_POLICIES: Final = (
    koordinator.MEMORY_WITHOUT_PAGE_CACHE,
    koordinator.MEMORY_WITH_HOT_PAGE_CACHE,
    koordinator.MEMORY_WITH_PAGE_CACHE,
)
_CALCULATE_POLICIES: Final = (strategy_module.USAGE, strategy_module.REQUEST, strategy_module.MAX_USAGE_REQUEST)
_POSITIVE: Final = (
    "metric_aggregate_duration_seconds",
    "metric_report_interval_seconds",
    "degrade_time_minutes",
    "update_time_threshold_seconds",
    "resource_diff_threshold",
)
_NON_NEGATIVE: Final = (
    "cpu_reclaim_threshold_percent",
    "memory_reclaim_threshold_percent",
    "batch_cpu_threshold_percent",
    "batch_memory_threshold_percent",
    "mid_static_cpu_reserved_percent",
    "mid_static_memory_reserved_percent",
)
_PERCENT: Final = ("mid_cpu_threshold_percent", "mid_memory_threshold_percent", "mid_unallocated_percent")
_CHOICES: Final[Mapping[str, tuple[str | None, ...]]] = {
    "metric_memory_collect_policy": _MEMORY_COLLECT_POLICIES,
    # "request" is accepted for CPU as Koordinator accepts it, but its batch calculator treats it as "usage".
    "cpu_calculate_policy": _CALCULATE_POLICIES,
    "memory_calculate_policy": _CALCULATE_POLICIES,
    "mid_reclaim_mode": (None, strategy_module.MID_RECLAIM_STATIC),
}


def strategy_problems(strategy: ColocationStrategy) -> list[tuple[str, str]]:
    """(field name, reason) for each rule of the §2.2 table the strategy breaks; unset optional caps pass."""
    problems: list[tuple[str, str]] = []
    for name in _POSITIVE:
        if not getattr(strategy, name) > 0:
            problems.append((name, f"must be > 0, got {getattr(strategy, name)!r}"))
    for name in _NON_NEGATIVE:
        value = getattr(strategy, name)
        if value is not None and value < 0:
            problems.append((name, f"must be ≥ 0, got {value!r}"))
    for name in _PERCENT:
        if not 0 <= getattr(strategy, name) <= 100:
            problems.append((name, f"must be between 0 and 100, got {getattr(strategy, name)!r}"))
    for name, allowed in _CHOICES.items():
        if getattr(strategy, name) not in allowed:
            names = ", ".join(choice for choice in allowed if choice is not None)
            problems.append((name, f"must be one of {names}, got {getattr(strategy, name)!r}"))
    return sorted(problems, key=lambda problem: _FIELD_ORDER[problem[0]])


# --- per node


class NodeStrategy(msgspec.Struct, frozen=True, kw_only=True):
    """A node's effective strategy and where it came from."""

    strategy: ColocationStrategy
    cluster_enabled: bool
    node_config_index: int | None = None
    """Index of the first nodeConfigs entry whose selector matched, None when none did."""
    node_config_name: str | None = None
    warnings: tuple[str, ...] = ()
    """Node annotation or label values that were ignored, and why."""

    @property
    def colocation_enabled(self) -> bool:
        """§2.3 step 3: batch and mid resources exist only when the cluster *and* the node strategy enable them."""
        return self.cluster_enabled and self.strategy.enable


def node_strategy(
    config: ClusterColocationConfig, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> NodeStrategy:
    """Cluster strategy → first matching nodeConfigs entry → node annotation → ratio labels (§2.2).

    Unlike Koordinator, an annotation that would make the strategy invalid is ignored (with a warning) rather than
    applied, so the result is always valid; labels can only set percentages ≥ 0, which are always valid.
    """
    strategy, index, name = config.strategy, None, None
    for position, entry in enumerate(config.node_configs):
        if selector_matches(entry.node_selector, labels):
            strategy, index, name = entry.strategy, position, entry.name
            break
    warnings: list[str] = []
    if ANNOTATION_NODE_STRATEGY in annotations:
        try:
            strategy = _merge_annotation(strategy, annotations[ANNOTATION_NODE_STRATEGY])
        except ColocationConfigError as err:
            warnings.append(f"annotation {ANNOTATION_NODE_STRATEGY} ignored: {err}")
    label_changes: dict[str, int] = {}
    for label, field_name in RATIO_LABELS.items():
        if label in labels:
            percent = _ratio_percent(labels[label])
            if percent is None:
                warnings.append(f"label {label}={labels[label]!r} ignored: not a non-negative number")
            else:
                label_changes[field_name] = percent
    return NodeStrategy(
        strategy=msgspec.structs.replace(strategy, **label_changes),
        cluster_enabled=config.strategy.enable,
        node_config_index=index,
        node_config_name=name,
        warnings=tuple(warnings),
    )


def _merge_annotation(base: ColocationStrategy, text: str) -> ColocationStrategy:
    try:
        decoded = msgspec.json.decode(text)
    except msgspec.DecodeError as err:
        raise ColocationConfigError([("$", f"not JSON: {err}")], malformed=True) from None
    if decoded is None:
        return base
    overrides = _decode(decoded, StrategyOverrides, _OVERRIDES_TYPE_INFO)
    syntax = _duration_syntax_problems(overrides, "$")
    if syntax:
        raise ColocationConfigError(syntax, malformed=True)
    return merge_strategy(base, overrides)


def _ratio_percent(text: str) -> int | None:
    """int(ratio × 100) of a label value as Go's ParseFloat reads it; None if unparsable, negative or not finite."""
    if text != text.strip() or "_" in text:
        return None  # Python's float() allows these, Go's ParseFloat does not
    try:
        ratio = float(text)
    except ValueError:
        return None
    if not math.isfinite(ratio) or ratio < 0 or ratio * 100 > _INT64_MAX:
        return None
    return int(ratio * 100)


def effective_strategy_from_json(
    config_obj: Mapping[str, Any] | None, labels: Mapping[str, str], annotations: Mapping[str, str]
) -> ColocationStrategy:
    """The strategy the batch/mid calculation uses for one node, from a decoded colocation-config object.

    `enable` is the §2.3 rule (cluster and node both enabled), so a node enabled only by its nodeConfigs entry while
    the cluster is disabled gets no batch resources, as in Koordinator. Raises ColocationConfigError when the
    cluster part is invalid.
    """
    result = node_strategy(parse_colocation_object(config_obj), labels, annotations)
    return msgspec.structs.replace(result.strategy, enable=result.colocation_enabled)


def metric_collect_policy(strategy: ColocationStrategy) -> node.MetricCollectPolicy:
    """§1.3: a node's NodeMetric spec comes from its strategy when that is enabled, else it is the default spec."""
    if not strategy.enable:
        return node.MetricCollectPolicy()
    return node.MetricCollectPolicy(
        aggregate_duration_seconds=strategy.metric_aggregate_duration_seconds,
        report_interval_seconds=strategy.metric_report_interval_seconds,
        durations_seconds=strategy.metric_aggregate_durations_seconds,
        node_memory_collect_policy=strategy.metric_memory_collect_policy,
    )


# --- back to Koordinator's JSON


def strategy_to_json(strategy: ColocationStrategy) -> dict[str, Any]:
    """Every field in camelCase, durations as Go prints them ("5m0s"); unset caps and empty extensions omitted."""
    fields = {name: getattr(strategy, name) for name in _PLAIN_FIELDS}
    durations = tuple(koordinator.format_go_duration(s) for s in strategy.metric_aggregate_durations_seconds)
    overrides = StrategyOverrides(
        **fields,
        metric_aggregate_policy=AggregatePolicyJSON(durations=durations),
        extensions=strategy.extensions or None,
    )
    return _plain_json(overrides)


def config_to_json(config: ClusterColocationConfig) -> dict[str, Any]:
    """The effective config: the full cluster strategy and each nodeConfigs entry with its merged strategy.

    Parsing it again gives the same strategies. Warnings stay on NodeColocationConfig, out of this Koordinator shape.
    """
    out = strategy_to_json(config.strategy)
    entries: list[dict[str, Any]] = []
    for entry in config.node_configs:
        head: dict[str, Any] = {"name": entry.name} if entry.name else {}
        if entry.node_selector is not None:
            head["nodeSelector"] = _plain_json(entry.node_selector)
        entries.append(head | strategy_to_json(entry.strategy))
    if entries:
        out["nodeConfigs"] = entries
    return out


def _plain_json(value: msgspec.Struct) -> dict[str, Any]:
    """The struct as the dicts and lists json.loads would give (to_builtins keeps tuples as tuples)."""
    decoded: dict[str, Any] = msgspec.json.decode(msgspec.json.encode(value))
    return decoded


# --- the ConfigMap load algorithm


class ColocationConfigState(msgspec.Struct, frozen=True, kw_only=True):
    """What the service knows of the ConfigMap (§2.2 load algorithm); `apply` returns the next state.

    `available` turns true on the first good load and stays true (the service reconciles no node before). An error
    keeps the last good config, never the defaults, which would disable co-location cluster-wide.
    """

    config: ClusterColocationConfig = msgspec.field(default_factory=ClusterColocationConfig)
    available: bool = False
    error: str | None = None
    """Why the ConfigMap's current content is not in effect; None once a load succeeds."""

    def apply(self, configmap_data: Mapping[str, str] | None) -> ConfigChange:
        """The state after seeing the ConfigMap's `data` (None: the ConfigMap does not exist → defaults)."""
        text = None if configmap_data is None else configmap_data.get(COLOCATION_CONFIG_KEY)
        try:
            config = parse_colocation_config(text)
        except ColocationConfigError as err:
            error = f"invalid {COLOCATION_CONFIG_KEY}, keeping the previous configuration: {err}"
            return ConfigChange(state=msgspec.structs.replace(self, error=error), changed=False)
        changed = not self.available or config != self.config
        return ConfigChange(state=ColocationConfigState(config=config, available=True), changed=changed)


class ConfigChange(msgspec.Struct, frozen=True, kw_only=True):
    """The new state, and whether the effective config changed (or just became available): re-enqueue all nodes."""

    state: ColocationConfigState
    changed: bool

    @property
    def config(self) -> ClusterColocationConfig:
        return self.state.config

    @property
    def available(self) -> bool:
        return self.state.available

    @property
    def error(self) -> str | None:
        return self.state.error
