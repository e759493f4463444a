"""LoadAwareSchedulingArgs (spec §6.2) with Koordinator's defaults, read from JSON or YAML. Pure.

The struct decodes Koordinator's names (`usageThresholds`, `estimatedScalingFactors`, …), so the args block of a
koord-scheduler profile can be reused as is. `with_defaults` applies the defaulting of Koordinator's
`SetDefaults_LoadAwareSchedulingArgs`: weights only when no weight and no dominant weight is given, thresholds only when
none is given, scaling factors completed key by key. `apply_watermarks` lets the slo-controller-config's
load-watermarks-config set the thresholds and staleness fields it shares with the descheduler. Used by
services.loadaware.core/estimator/state, the loadaware service and `koordbus scheduler explain`.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Final

import msgspec
import yaml

from schemas import koordinator, resources
from schemas.qos import WatermarksInEffect
from services.slo.watermarks import WatermarkConfig, Watermarks, fields_set

AGGREGATION_TYPES: Final = frozenset({"avg", "p50", "p90", "p95", "p99"})
DEFAULT_WEIGHTS: Final = {resources.CPU: 1, resources.MEMORY: 1}
DEFAULT_THRESHOLDS: Final = {resources.CPU: 65, resources.MEMORY: 95}
DEFAULT_SCALING_FACTORS: Final = {resources.CPU: 85, resources.MEMORY: 70}
DEFAULT_EXPIRATION_SECONDS: Final = 180


class ArgsError(ValueError):
    """Args that cannot be used; the message names the source and the field."""


class AggregatedArgs(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
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
    """Koordinator's ValidateLoadAwareSchedulingArgs, plus the aggregation names and durations."""
    if args.node_metric_expiration_seconds <= 0:
        raise ArgsError("nodeMetricExpirationSeconds: must be positive")
    if args.dominant_resource_weight < 0:
        raise ArgsError("dominantResourceWeight: must not be negative")
    for field, mapping, high in (
        ("resourceWeights", args.resource_weights, None),
        ("usageThresholds", args.usage_thresholds, 100),
        ("prodUsageThresholds", args.prod_usage_thresholds, 100),
        ("estimatedScalingFactors", args.estimated_scaling_factors, 100),
    ):
        for name, value in mapping.items():
            if value < 0 or (high is not None and value > high):
                bound = f"0..{high}" if high is not None else "≥ 0"
                raise ArgsError(f"{field}.{name}: {value} is outside {bound}")
    if args.estimator != "default":
        raise ArgsError(f"estimator: only 'default' is offered, not {args.estimator!r}")
    if (agg := args.aggregated) is not None:
        for name, value in agg.usage_thresholds.items():
            if not 0 <= value <= 100:
                raise ArgsError(f"aggregated.usageThresholds.{name}: {value} is outside 0..100")
        for field, kind in (
            ("usageAggregationType", agg.usage_aggregation_type),
            ("scoreAggregationType", agg.score_aggregation_type),
        ):
            if kind and kind not in AGGREGATION_TYPES:
                raise ArgsError(f"aggregated.{field}: {kind!r} is not one of {sorted(AGGREGATION_TYPES)}")
        for field, text in (
            ("usageAggregatedDuration", agg.usage_aggregated_duration),
            ("scoreAggregatedDuration", agg.score_aggregated_duration),
        ):
            duration_seconds(text, field=f"aggregated.{field}")


def duration_seconds(text: str, *, field: str = "duration") -> int:
    """A Go duration of whole seconds ("5m", "1h30m", "300s") in seconds (schemas.koordinator.parse_go_duration);
    "" or "0" is 0 (the longest one)."""
    if text in ("", "0"):
        return 0
    try:
        seconds = koordinator.parse_go_duration(text)
    except ValueError:
        seconds = Fraction(-1)
    if seconds < 0 or seconds.denominator != 1:
        raise ArgsError(f"{field}: {text!r} is not a duration of whole seconds like '5m' or '300s'")
    return int(seconds)


def load_args(text: str, *, source: str = "args") -> LoadAwareArgs:
    """LoadAwareSchedulingArgs from a JSON or YAML document, checked and defaulted; ArgsError names what is wrong."""
    try:
        document = yaml.safe_load(text) if text.strip() else {}
    except yaml.YAMLError as err:
        raise ArgsError(f"{source}: not JSON or YAML: {' '.join(str(err).split())}") from None
    if not isinstance(document, dict):
        raise ArgsError(f"{source}: expected an object of LoadAwareSchedulingArgs")
    try:
        args = msgspec.convert(document, LoadAwareArgs, strict=False)
    except msgspec.ValidationError as err:
        raise ArgsError(f"{source}: {err}") from None
    check_args(args)
    return with_defaults(args)


def apply_watermarks(args: LoadAwareArgs, marks: Watermarks) -> LoadAwareArgs:
    """The args with each field the slo-controller-config's load-watermarks-config sets taking its value
    (services.slo.watermarks): the thresholds and the staleness rule the descheduler shares."""
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
