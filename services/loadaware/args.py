"""LoadAwareSchedulingArgs (spec §6.2) with Koordinator's defaults and validation, read from JSON or YAML. Pure.

The struct decodes Koordinator's v1 names (`usageThresholds`, `estimatedScalingFactors`, …), so the args block of a
koord-scheduler profile can be reused as is. `convert_args` reads a decoded document as Go does (a `null` field is
the field left out; a value of the wrong type is an `ArgsFormatError`), `with_defaults` applies Koordinator's
`SetDefaults_LoadAwareSchedulingArgs` (weights only when no weight and no dominant weight is given, thresholds only
when none is given, scaling factors completed key by key), and `check_args` is its `ValidateLoadAwareSchedulingArgs`
on the defaulted args (an `ArgsError`). `load_args` does all three for the service's args file; `koordbus calc
loadaware` reports a rejected `ArgsError` as Koordinator's calculation error and an `ArgsFormatError` as bad input.
`to_json` writes the args back in Koordinator's names (the extender's state export). `apply_watermarks` lets the
slo-controller-config's load-watermarks-config set the thresholds and staleness fields it shares with the
descheduler. The document is read, its durations parsed and its errors raised as every service's args are
(services.common.args). Used by services.loadaware.core/estimator/state/snapshot, the loadaware service and
`koordbus calc`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

import msgspec

from schemas import resources
from schemas.qos import WatermarksInEffect
from services.common import args as common_args
from services.common.args import ArgsError, ArgsFormatError, duration_seconds
from services.common.watermarks import WatermarkConfig, Watermarks, fields_set

AGGREGATION_TYPES: Final = frozenset({"avg", "p50", "p90", "p95", "p99"})
DEFAULT_WEIGHTS: Final = {resources.CPU: 1, resources.MEMORY: 1}
DEFAULT_THRESHOLDS: Final = {resources.CPU: 65, resources.MEMORY: 95}
DEFAULT_SCALING_FACTORS: Final = {resources.CPU: 85, resources.MEMORY: 70}
DEFAULT_EXPIRATION_SECONDS: Final = 180
MAX_PERCENT: Final = 100


class AggregatedArgs(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """Thresholds on aggregated usage (a percentile over a duration) instead of the latest usage."""

    usage_thresholds: dict[str, int] = {}
    usage_aggregation_type: str = ""
    usage_aggregated_duration: str = ""
    """A Go duration ("5m"); empty or 0 means the longest duration the NodeMetric reports."""
    score_aggregation_type: str = ""
    score_aggregated_duration: str = ""


class LoadAwareArgs(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    filter_expired_node_metrics: bool = True
    node_metric_expiration_seconds: int = DEFAULT_EXPIRATION_SECONDS
    enable_schedule_when_node_metrics_expired: bool = False
    resource_weights: dict[str, int] = {}
    dominant_resource_weight: int = 0
    usage_thresholds: dict[str, int] = {}
    prod_usage_thresholds: dict[str, int] = {}
    prod_usage_include_sys: bool = False
    score_according_prod_usage: bool = False
    estimator: str = "default"
    """Any name selects Koordinator's DefaultEstimator (the only one it registers)."""
    estimated_scaling_factors: dict[str, int] = {}
    estimated_seconds_after_pod_scheduled: int | None = None
    estimated_seconds_after_initialized: int | None = None
    allow_customize_estimation: bool = False
    aggregated: AggregatedArgs | None = None
    supported_resources: list[str] = []

    def vector(self) -> tuple[str, ...]:
        """The resources every calculation looks at: cpu, memory and every name any map or list mentions."""
        names = {resources.CPU, resources.MEMORY, *self.supported_resources}
        for mapping in (
            self.resource_weights,
            self.usage_thresholds,
            self.prod_usage_thresholds,
            self.estimated_scaling_factors,
            self.aggregated.usage_thresholds if self.aggregated else {},
        ):
            names.update(mapping)
        return tuple(sorted(names))


def with_defaults(args: LoadAwareArgs) -> LoadAwareArgs:
    """Koordinator's defaulting (spec §6.2)."""
    weights = args.resource_weights
    if not weights and args.dominant_resource_weight == 0:
        weights = dict(DEFAULT_WEIGHTS)
    return msgspec.structs.replace(
        args,
        resource_weights=weights,
        usage_thresholds=args.usage_thresholds or dict(DEFAULT_THRESHOLDS),
        estimated_scaling_factors={**DEFAULT_SCALING_FACTORS, **args.estimated_scaling_factors},
    )


def check_args(args: LoadAwareArgs) -> None:
    """Koordinator's ValidateLoadAwareSchedulingArgs of the defaulted args; the first problem as an ArgsError.

    Like Koordinator: prodUsageThresholds and the estimator's name are not checked, a weight or scaling factor must
    be in 1..100 and a threshold in 0..100, every weighted resource needs a scaling factor, and an aggregated duration
    may be anything but negative (one no NodeMetric reports simply finds no aggregated usage)."""
    if args.node_metric_expiration_seconds <= 0:
        raise ArgsError(f"nodeMetricExpirationSeconds: {args.node_metric_expiration_seconds} must be positive")
    if not 0 <= args.dominant_resource_weight <= MAX_PERCENT:
        raise ArgsError(f"dominantResourceWeight: {args.dominant_resource_weight} is outside 0..{MAX_PERCENT}")
    for field, mapping, low in (
        ("resourceWeights", args.resource_weights, 1),
        ("usageThresholds", args.usage_thresholds, 0),
        ("estimatedScalingFactors", args.estimated_scaling_factors, 1),
        ("aggregated.usageThresholds", args.aggregated.usage_thresholds if args.aggregated else {}, 0),
    ):
        for name, value in sorted(mapping.items()):
            if not low <= value <= MAX_PERCENT:
                raise ArgsError(f"{field}.{name}: {value} is outside {low}..{MAX_PERCENT}")
    for name in sorted(args.resource_weights):
        if name not in args.estimated_scaling_factors:
            raise ArgsError(f"estimatedScalingFactors.{name}: missing for the weighted resource {name}")
    if (agg := args.aggregated) is not None:
        for field, kind, duration in (
            ("usage", agg.usage_aggregation_type, agg.usage_aggregated_duration),
            ("score", agg.score_aggregation_type, agg.score_aggregated_duration),
        ):
            if kind and kind not in AGGREGATION_TYPES:
                known = sorted(AGGREGATION_TYPES)
                raise ArgsError(f"aggregated.{field}AggregationType: {kind!r} is not one of {known}")
            if duration_seconds(duration, field=f"aggregated.{field}AggregatedDuration") < 0:
                raise ArgsError(f"aggregated.{field}AggregatedDuration: {duration!r} must not be negative")


def _without_nulls(document: Any) -> Any:
    """Go decodes a `null` field as the field left out (a nil pointer or map, a zero number): drop them."""
    if not isinstance(document, Mapping):
        return document
    out = {key: value for key, value in document.items() if value is not None}
    if isinstance(aggregated := out.get("aggregated"), Mapping):
        out["aggregated"] = {key: value for key, value in aggregated.items() if value is not None}
    return out


def convert_args(document: Any, *, source: str = "args", strict: bool = True) -> LoadAwareArgs:
    """A decoded LoadAwareSchedulingArgs document (neither defaulted nor checked); ArgsFormatError naming the field
    when it is not one. `strict=False` for YAML, where `8e9` without a dot reads as a string."""
    document = _without_nulls({} if document is None else document)
    args = common_args.convert(document, LoadAwareArgs, name="LoadAwareSchedulingArgs", source=source, strict=strict)
    if (agg := args.aggregated) is not None:
        duration_seconds(agg.usage_aggregated_duration, field=f"{source}: aggregated.usageAggregatedDuration")
        duration_seconds(agg.score_aggregated_duration, field=f"{source}: aggregated.scoreAggregatedDuration")
    return args


def load_args(text: str, *, source: str = "args") -> LoadAwareArgs:
    """LoadAwareSchedulingArgs from a JSON or YAML document, defaulted and checked; ArgsError names what is wrong."""
    document = common_args.load_document(text, source=source)
    args = with_defaults(convert_args(document, source=source, strict=False))
    try:
        check_args(args)
    except ArgsFormatError:
        raise
    except ArgsError as err:
        raise ArgsError(f"{source}: {err}") from None
    return args


def to_json(args: LoadAwareArgs) -> dict[str, Any]:
    """The args in Koordinator's v1 names, every field written (what `convert_args` reads back to equal args)."""
    out: dict[str, Any] = msgspec.to_builtins(args)
    if out.get("aggregated") is None:
        out.pop("aggregated", None)
    for field in ("estimatedSecondsAfterPodScheduled", "estimatedSecondsAfterInitialized"):
        if out.get(field) is None:
            out.pop(field, None)
    return out


def apply_watermarks(args: LoadAwareArgs, marks: Watermarks) -> LoadAwareArgs:
    """The args with each field the slo-controller-config's load-watermarks-config sets taking its value
    (services.common.watermarks): the thresholds and the staleness rule the descheduler shares."""
    changes: dict[str, object] = {}
    if marks.usage_thresholds is not None:
        changes["usage_thresholds"] = dict(marks.usage_thresholds)
    if marks.prod_usage_thresholds is not None:
        changes["prod_usage_thresholds"] = dict(marks.prod_usage_thresholds)
    if marks.node_metric_expiration_seconds is not None:
        changes["node_metric_expiration_seconds"] = marks.node_metric_expiration_seconds
    if marks.enable_schedule_when_node_metrics_expired is not None:
        changes["enable_schedule_when_node_metrics_expired"] = marks.enable_schedule_when_node_metrics_expired
    return msgspec.structs.replace(args, **changes) if changes else args


def stated_watermarks(args: LoadAwareArgs, config: WatermarkConfig, *, at: float) -> WatermarksInEffect:
    """What the extender decides with (args with the watermarks applied), as it states it on the KOORD_SLO bucket."""
    return WatermarksInEffect(
        service="loadaware",
        at=at,
        usage_thresholds={r: float(v) for r, v in args.usage_thresholds.items()},
        prod_usage_thresholds={r: float(v) for r, v in args.prod_usage_thresholds.items()},
        stale_after_seconds=float(args.node_metric_expiration_seconds),
        schedule_when_stale=not args.filter_expired_node_metrics or args.enable_schedule_when_node_metrics_expired,
        avoid_eviction_loops=config.watermarks.avoid_eviction_loops,
        from_configmap=fields_set(config.watermarks),
        configmap_errors=dict(config.errors),
    )


DEFAULT_ARGS: Final = with_defaults(LoadAwareArgs())
