"""`GET /api/v1/config/watermarks`: the load thresholds of placement, descheduling and node QoS side by side.

Three deciders draw lines on a node's load: the load-aware scheduler extender (filter), the descheduler (drain above,
fill below) and each node's agent (suppress and evict BE pods). services.common.watermarks explains how koordbus makes
them one model. This route reads what each one uses:
* the slo-controller-config ConfigMap as the bridge last published it: our `load-watermarks-config` key and node
  QoS's `resource-threshold-config` (the cluster strategy and every node strategy);
* the WatermarksInEffect the loadaware and migration services stated in the KOORD_SLO bucket (a service that has
  not stated any is shown from the defaults with the key applied, marked `reported: false`);
and lists per resource what each decider does at which percent, the staleness rules, and the findings of
services.common.watermarks.findings (an evict → reschedule loop, a scheduler admitting above the descheduler's line,
different staleness bounds), plus the ConfigMap keys in error. Role viewer. Mounted by services.api.app.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import msgspec
from fastapi import APIRouter, HTTPException, Request
from pydantic import BaseModel, Field

from bus.errors import BusError
from schemas.qos import WatermarksInEffect
from services.common import watermarks
from services.common.sloconfig import CONFIGMAP_NAME, CONFIGMAP_NAMESPACE
from services.common.watermark_feed import WatermarkReader

router = APIRouter(prefix="/api/v1")

QOS_FIELDS = (
    "enable",
    "cpuSuppressThresholdPercent",
    "cpuSuppressMinPercent",
    "cpuEvictThresholdPercent",
    "cpuEvictLowerPercent",
    "memoryEvictThresholdPercent",
    "memoryEvictLowerPercent",
    "evictEnabledPriorityThreshold",
)
RESOURCES = ("cpu", "memory")


class WatermarksView(BaseModel):
    configMap: dict[str, Any] = Field(
        description="namespace, name, found, resourceVersion, the load-watermarks-config as set (null: absent) "
        "and the keys in error (their last good value, or the default, is in use)"
    )
    scheduler: dict[str, Any] = Field(
        description="the load-aware extender's usageThresholds, prodUsageThresholds, staleAfterSeconds, "
        "scheduleWhenStale, avoidEvictionLoops; fromConfigMap names the fields the key set; reported false: the "
        "service has not stated them (defaults with the key applied)"
    )
    descheduler: dict[str, Any] = Field(
        description="enabled, the overloaded line (usageThresholds), lowThresholds, staleAfterSeconds; as for scheduler"
    )
    nodeQoS: list[dict[str, Any]] = Field(
        description="each resource-threshold-config strategy (cluster first, then node strategies in match "
        "order) with its suppress and evict thresholds"
    )
    resources: list[dict[str, Any]] = Field(
        description="per resource, side by side: schedule (filter line), scheduleProd, descheduleHigh, "
        "descheduleLow, and per node QoS strategy its suppress/evict percent and the cap the scheduler puts on "
        "pods it could evict"
    )
    staleness: dict[str, Any] = Field(description="how old a NodeMetric may be for each decider, in seconds")
    findings: list[dict[str, str]] = Field(description="severity (warning, info), code and message")


def _reader(request: Request) -> WatermarkReader:
    reader: WatermarkReader | None = request.app.state.context.watermark_reader
    if reader is None:
        raise HTTPException(503, "the watermarks are not available: this API runs without a bus to read them from")
    return reader


def _section(stated: WatermarksInEffect, *, reported: bool) -> dict[str, Any]:
    section = {k: v for k, v in msgspec.to_builtins(stated).items() if k not in ("type", "service")}
    camel = {
        "usage_thresholds": "usageThresholds",
        "prod_usage_thresholds": "prodUsageThresholds",
        "low_thresholds": "lowThresholds",
        "stale_after_seconds": "staleAfterSeconds",
        "schedule_when_stale": "scheduleWhenStale",
        "avoid_eviction_loops": "avoidEvictionLoops",
        "from_configmap": "fromConfigMap",
        "configmap_errors": "configMapErrors",
    }
    return {"reported": reported, **{camel.get(k, k): v for k, v in section.items()}}


def build_view(
    *,
    configmap: dict[str, Any],
    data: dict[str, str] | None,
    stated: dict[str, WatermarksInEffect],
    defaults: Mapping[str, watermarks.DeciderDefaults],
    dashboard_stale_seconds: float,
) -> WatermarksView:
    """The view from the ConfigMap's data (None: not published) and what the services stated; a decider that stated
    nothing is shown as its `defaults` ("loadaware", "descheduler") would state it. Pure."""
    config = watermarks.read_watermarks(data)
    scheduler = stated.get("loadaware") or defaults["loadaware"](config)
    descheduler = stated.get("descheduler") or defaults["descheduler"](config)
    strategies: list[tuple[str, dict[str, Any], dict[str, Any] | None]] = [
        ("cluster", dict(config.thresholds.cluster), None)
    ]
    for index, node in enumerate(config.thresholds.nodes):
        label = f"nodeStrategies[{index}]" + (f" {node.name}" if node.name else "")
        strategies.append((label, dict(node.strategy), msgspec.to_builtins(node.node_selector)))
    node_qos = [
        {"strategy": label, "nodeSelector": selector, **{f: strategy.get(f) for f in QOS_FIELDS}}
        for label, strategy, selector in strategies
    ]
    deschedule_on = descheduler.enabled and "descheduler" in stated
    rows = []
    for resource in RESOURCES:
        qos = []
        for label, strategy, _ in strategies:
            evict = strategy.get(f"{resource}EvictThresholdPercent") if strategy.get("enable") else None
            suppress = (
                strategy.get("cpuSuppressThresholdPercent") if resource == "cpu" and strategy.get("enable") else None
            )
            be = watermarks.EvictionFacts(best_effort=True, eviction_enabled=False, priority=0)
            cap = watermarks.eviction_caps(strategy, be).get(resource) if scheduler.avoid_eviction_loops else None
            qos.append({"strategy": label, "suppress": suppress, "evict": evict, "capForBEPods": cap})
        rows.append(
            {
                "resource": resource,
                "schedule": scheduler.usage_thresholds.get(resource),
                "scheduleProd": scheduler.prod_usage_thresholds.get(resource),
                "descheduleHigh": descheduler.usage_thresholds.get(resource) if descheduler.enabled else None,
                "descheduleLow": descheduler.low_thresholds.get(resource) if descheduler.enabled else None,
                "nodeQoS": qos,
            }
        )
    found = watermarks.findings(
        schedule={r: round(v) for r, v in scheduler.usage_thresholds.items()},
        deschedule_high=descheduler.usage_thresholds if deschedule_on else None,
        scheduler_stale_seconds=scheduler.stale_after_seconds,
        descheduler_stale_seconds=descheduler.stale_after_seconds if deschedule_on else None,
        strategies=[(label, strategy) for label, strategy, _ in strategies],
        avoid_eviction_loops=scheduler.avoid_eviction_loops,
    )
    notes = [
        {"severity": "warning", "code": "config-error", "message": f"{key}: {why}"}
        for key, why in sorted(config.errors.items())
    ]
    if config.watermarks == watermarks.ABSENT and watermarks.WATERMARKS_KEY not in config.errors:
        notes.append(
            {
                "severity": "info",
                "code": "no-shared-watermarks",
                "message": f"{watermarks.WATERMARKS_KEY} is not set: the scheduler and the descheduler each use "
                "their own args; set usageThresholds there to give both the same line",
            }
        )
    for service, name in (("loadaware", "scheduler"), ("descheduler", "descheduler")):
        if service not in stated:
            notes.append(
                {
                    "severity": "info",
                    "code": "not-reported",
                    "message": f"the {name} has not stated its watermarks (not running, or an older version): "
                    "shown are the defaults with the ConfigMap applied",
                }
            )
    return WatermarksView(
        configMap={
            **configmap,
            watermarks.WATERMARKS_KEY: None
            if config.watermarks == watermarks.ABSENT
            else msgspec.to_builtins(config.watermarks),
            "errors": dict(config.errors),
        },
        scheduler=_section(scheduler, reported="loadaware" in stated),
        descheduler=_section(descheduler, reported="descheduler" in stated),
        nodeQoS=node_qos,
        resources=rows,
        staleness={
            "schedulerSeconds": scheduler.stale_after_seconds,
            "schedulerAllowsStale": scheduler.schedule_when_stale,
            "deschedulerSeconds": descheduler.stale_after_seconds,
            "dashboardSeconds": dashboard_stale_seconds,
        },
        findings=[*notes, *(msgspec.to_builtins(f) for f in found)],
    )


@router.get(
    "/config/watermarks",
    tags=["config"],
    summary="Load thresholds of scheduling, descheduling and node QoS side by side",
    description="What the load-aware scheduler filters at, what the descheduler drains above and fills below, and "
    "what each node QoS strategy suppresses and evicts at, per resource, with the staleness rules and the "
    "incoherences that make pods cycle (evicted, then scheduled straight back). Read from slo-controller-config "
    "and from what the services stated they use.",
    response_model=WatermarksView,
    responses={503: {"description": "The bus is unreachable"}},
)
async def get_watermarks(request: Request) -> WatermarksView:
    reader = _reader(request)
    try:
        seen = await reader.configmap(CONFIGMAP_NAMESPACE, CONFIGMAP_NAME)
        stated = await reader.watermarks_in_effect()
    except BusError as e:
        raise HTTPException(503, f"cannot read the watermarks: {e}") from None
    configmap = {
        "namespace": CONFIGMAP_NAMESPACE,
        "name": CONFIGMAP_NAME,
        "found": seen is not None,
        "resourceVersion": seen.resource_version if seen is not None else None,
    }
    context = request.app.state.context
    missing = {"loadaware", "descheduler"} - set(stated) - set(context.watermark_defaults)
    if missing:
        raise HTTPException(503, f"the watermarks view has no defaults for {', '.join(sorted(missing))}")
    return build_view(
        configmap=configmap,
        data=seen.data if seen is not None else None,
        stated=stated,
        defaults=context.watermark_defaults,
        dashboard_stale_seconds=context.settings.stale_after_seconds,
    )
