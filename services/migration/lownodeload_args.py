"""Koordinator's `LowNodeLoadArgs` (v1alpha2) for one Balance round (spec §11.2): decoding, defaults, the node pools,
validation. Pure.

`LowNodeLoadArgsJSON` is the v1alpha2 subset as written. `resolve` applies Koordinator's defaults (nodeFit true,
expiration 180 s, anomaly condition {1m, 5, 3} with only one zero count defaulted, resource weights 1 for cpu,
memory and every low/high threshold key), lets each configured pool inherit what it leaves nil (threshold maps,
weights, condition, and a zero count inside its condition) and prepends the pool `__default_node_pool__` made of
the top-level fields. As in Go, the default pool and every inheriting pool share the very same threshold maps:
the round fills missing resources into them (services.migration.lownodeload_balance.new_thresholds), and a later
pool sees those entries. `validate` returns Koordinator's validation errors (an aggregate message) or None.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from fractions import Fraction
from typing import Annotated, Final

import msgspec

from schemas.koordinator import parse_go_duration
from schemas.scheduling import label_selector_error
from schemas.selectors import LabelSelector

DEFAULT_POOL: Final = "__default_node_pool__"
DEFAULT_EXPIRATION_SECONDS: Final = 180
DEFAULT_ABNORMALITIES: Final = 5
DEFAULT_NORMALITIES: Final = 3
DEFAULT_ANOMALY_TIMEOUT: Final = "1m"

Count = Annotated[int, msgspec.Meta(ge=0, le=2**32 - 1)]
"""A uint32 count, as Go decodes it."""
Thresholds = dict[str, float]
"""Percent of allocatable per resource (Koordinator's ResourceThresholds)."""


class AnomalyConditionJSON(msgspec.Struct, kw_only=True, rename="camel"):
    timeout: str | None = None
    consecutive_abnormalities: Count = 0
    consecutive_normalities: Count = 0


class NamespacesJSON(msgspec.Struct, frozen=True, kw_only=True):
    include: list[str] | None = None
    exclude: list[str] | None = None


class PodSelectorJSON(msgspec.Struct, frozen=True, kw_only=True):
    name: str = ""
    selector: LabelSelector | None = None


class NodePoolJSON(msgspec.Struct, kw_only=True, rename="camel"):
    name: str = ""
    node_selector: LabelSelector | None = None
    use_deviation_thresholds: bool = False
    high_thresholds: Thresholds | None = None
    low_thresholds: Thresholds | None = None
    prod_high_thresholds: Thresholds | None = None
    prod_low_thresholds: Thresholds | None = None
    resource_weights: dict[str, int] | None = None
    anomaly_condition: AnomalyConditionJSON | None = None


class LowNodeLoadArgsJSON(msgspec.Struct, kw_only=True, rename="camel"):
    paused: bool | None = None
    dry_run: bool | None = None
    number_of_nodes: Annotated[int, msgspec.Meta(ge=-(2**31), le=2**31 - 1)] | None = None
    node_metric_expiration_seconds: Annotated[int, msgspec.Meta(ge=-(2**63), le=2**63 - 1)] | None = None
    evictable_namespaces: NamespacesJSON | None = None
    node_selector: LabelSelector | None = None
    pod_selectors: list[PodSelectorJSON] | None = None
    node_fit: bool | None = None
    use_deviation_thresholds: bool | None = None
    high_thresholds: Thresholds | None = None
    low_thresholds: Thresholds | None = None
    prod_high_thresholds: Thresholds | None = None
    prod_low_thresholds: Thresholds | None = None
    resource_weights: dict[str, int] | None = None
    anomaly_condition: AnomalyConditionJSON | None = None
    detector_cache_timeout: str | None = None
    node_pools: list[NodePoolJSON] | None = None


@dataclass(frozen=True)
class AnomalyCondition:
    timeout_seconds: Fraction
    """0 (or negative) means the detector's own default, 60 s."""
    consecutive_abnormalities: int
    consecutive_normalities: int


@dataclass(frozen=True)
class NodePool:
    """One pool as the round runs it. The threshold maps may be shared with other pools (see the module doc)."""

    name: str
    node_selector: LabelSelector | None
    use_deviation_thresholds: bool
    low: Thresholds | None
    high: Thresholds | None
    prod_low: Thresholds | None
    prod_high: Thresholds | None
    weights: dict[str, int] | None
    condition: AnomalyCondition | None


@dataclass(frozen=True)
class LowNodeLoadArgs:
    paused: bool
    dry_run: bool
    number_of_nodes: int
    expiration_seconds: int
    include_namespaces: frozenset[str]
    exclude_namespaces: frozenset[str]
    pod_selectors: tuple[PodSelectorJSON, ...]
    node_fit: bool
    pools: tuple[NodePool, ...]
    problems: tuple[str, ...]
    """Koordinator's validation errors; the round does not run when there are any."""


def _condition(raw: AnomalyConditionJSON | None) -> AnomalyCondition | None:
    if raw is None:
        return None
    try:
        timeout = parse_go_duration(raw.timeout) if raw.timeout else Fraction(0)
    except ValueError:
        raise ValueError(f"anomalyCondition.timeout: invalid duration {raw.timeout!r}") from None
    return AnomalyCondition(timeout, raw.consecutive_abnormalities, raw.consecutive_normalities)


def _default_weights(raw: LowNodeLoadArgsJSON) -> dict[str, int]:
    defaults = {"cpu": 1, "memory": 1}
    for name in [*(raw.low_thresholds or {}), *(raw.high_thresholds or {})]:
        defaults[name] = 1
    if raw.resource_weights is None:
        return defaults
    weights = dict(raw.resource_weights)
    for name, weight in defaults.items():
        if weights.get(name, 0) <= 0:
            weights[name] = weight
    return weights


def _top_condition(raw: AnomalyConditionJSON | None) -> AnomalyConditionJSON:
    if raw is None:
        return AnomalyConditionJSON(
            timeout=DEFAULT_ANOMALY_TIMEOUT,
            consecutive_abnormalities=DEFAULT_ABNORMALITIES,
            consecutive_normalities=DEFAULT_NORMALITIES,
        )
    if raw.consecutive_abnormalities == 0:
        raw.consecutive_abnormalities = DEFAULT_ABNORMALITIES
    elif raw.consecutive_normalities == 0:
        raw.consecutive_normalities = DEFAULT_NORMALITIES
    return raw


def _inherited_condition(own: AnomalyConditionJSON | None, top: AnomalyConditionJSON) -> AnomalyConditionJSON:
    if own is None:
        return top
    if own.consecutive_abnormalities == 0:
        own.consecutive_abnormalities = top.consecutive_abnormalities
    if own.consecutive_normalities == 0:
        own.consecutive_normalities = top.consecutive_normalities
    return own


def resolve(raw: LowNodeLoadArgsJSON) -> LowNodeLoadArgs:
    """Defaults, pool inheritance and conversion to the internal pools; ValueError for an unreadable duration."""
    top_condition = _top_condition(raw.anomaly_condition)
    weights = _default_weights(raw)
    converted = _condition(top_condition)
    pools = [
        NodePool(
            DEFAULT_POOL,
            raw.node_selector,
            bool(raw.use_deviation_thresholds),
            raw.low_thresholds,
            raw.high_thresholds,
            raw.prod_low_thresholds,
            raw.prod_high_thresholds,
            weights,
            converted,
        )
    ]
    for pool in raw.node_pools or []:
        condition = _inherited_condition(pool.anomaly_condition, top_condition)
        pools.append(
            NodePool(
                pool.name,
                pool.node_selector,
                pool.use_deviation_thresholds,
                raw.low_thresholds if pool.low_thresholds is None else pool.low_thresholds,
                raw.high_thresholds if pool.high_thresholds is None else pool.high_thresholds,
                raw.prod_low_thresholds if pool.prod_low_thresholds is None else pool.prod_low_thresholds,
                raw.prod_high_thresholds if pool.prod_high_thresholds is None else pool.prod_high_thresholds,
                weights if pool.resource_weights is None else pool.resource_weights,
                converted if condition is top_condition else _condition(condition),
            )
        )
    namespaces = raw.evictable_namespaces or NamespacesJSON()
    expiration = DEFAULT_EXPIRATION_SECONDS if raw.node_metric_expiration_seconds is None else None
    args = LowNodeLoadArgs(
        paused=bool(raw.paused),
        dry_run=bool(raw.dry_run),
        number_of_nodes=raw.number_of_nodes or 0,
        expiration_seconds=expiration if expiration is not None else int(raw.node_metric_expiration_seconds or 0),
        include_namespaces=frozenset(namespaces.include or ()),
        exclude_namespaces=frozenset(namespaces.exclude or ()),
        pod_selectors=tuple(raw.pod_selectors or ()),
        node_fit=True if raw.node_fit is None else raw.node_fit,
        pools=tuple(pools),
        problems=(),
    )
    return dataclasses.replace(args, problems=tuple(validate(args)))


def _invalid(path: str, value: object, detail: str) -> str:
    """field.Invalid(...).Error(); a whole float prints without its ".0", as Go's %v does."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e21:
        value = int(value)
    return f"{path}: Invalid value: {value}: {detail}"


def _threshold_problems(index: int, pool: NodePool) -> list[str]:
    where = f"nodePools[{index}]"
    high, low = pool.high or {}, pool.low or {}
    prod_high, prod_low = pool.prod_high or {}, pool.prod_low or {}
    problems = [
        _invalid(f"{where}.highThresholds[{r}]", p, "percentage must be greater than or equal to 0")
        for r, p in high.items()
        if p < 0
    ]
    # each map: its name in the messages, the map it must stay at or under, and what the message says then
    for name, values, ceiling, detail in (
        ("lowThresholds", low, high, "low percentage must be less than or equal to highThresholds"),
        ("ProdHighThresholds", prod_high, high, "node percentage must be greater than or equal to prodHighThresholds"),
        ("ProdLowThresholds", prod_low, prod_high, "low percentage must be less than or equal to prodHighThresholds"),
    ):
        for r, p in values.items():
            if p < 0:
                problems.append(_invalid(f"{where}.{name}[{r}]", p, "percentage must be greater than or equal to 0"))
            if r in ceiling and p > ceiling[r]:
                problems.append(_invalid(f"{where}.{name}[{r}]", p, detail))
    return problems


def validate(args: LowNodeLoadArgs) -> list[str]:
    """ValidateLowLoadUtilizationArgs on the converted args, in Go's order."""
    problems: list[str] = []
    if args.number_of_nodes < 0:
        problems.append(_invalid("numberOfNodes", args.number_of_nodes, "must be greater than or equal to 0"))
    if args.expiration_seconds <= 0:
        problems.append(
            _invalid(
                "nodeMetricExpiredSeconds",
                args.expiration_seconds,
                "nodeMetricExpiredSeconds should be a positive value",
            )
        )
    if args.include_namespaces and args.exclude_namespaces:
        problems.append(_invalid("evictableNamespaces", "{...}", "only one of Include/Exclude namespaces can be set"))
    for i, selector in enumerate(args.pod_selectors):
        error = label_selector_error(selector.selector)
        if error:
            problems.append(_invalid(f"podSelectors[{i}]", selector.name, error))
    for i, pool in enumerate(args.pools):
        error = label_selector_error(pool.node_selector)
        if error:
            problems.append(_invalid(f"nodePools[{i}].nodeSelector", "{...}", error))
        problems += _threshold_problems(i, pool)
        condition = pool.condition
        if condition is not None and condition.consecutive_abnormalities <= 0:
            problems.append(
                _invalid(
                    f"nodePools[{i}].anomalyDetectionThresholds.consecutiveAbnormalities",
                    condition.consecutive_abnormalities,
                    "consecutiveAbnormalities must be greater than 0",
                )
            )
        if condition is not None and condition.consecutive_normalities <= 0:
            problems.append(
                _invalid(
                    f"nodePools[{i}].anomalyDetectionThresholds.consecutiveNormalities",
                    condition.consecutive_normalities,
                    "consecutiveNormalities must be greater than 0",
                )
            )
    return problems


def error_message(problems: tuple[str, ...]) -> str:
    """utilerrors.Aggregate's Error(): the one message, or `[a, b]`."""
    return problems[0] if len(problems) == 1 else "[" + ", ".join(problems) + "]"
