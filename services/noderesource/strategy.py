"""ColocationStrategy: the per-node knobs of the `colocation-config` key (spec §2.2), with Koordinator's defaults.

Shared by services.noderesource.config (parsing Koordinator's JSON into it, validation, cluster/node merging, and
rendering it back as that JSON) and services.noderesource.core (the batch and mid calculation). Field names are
Koordinator's JSON names in snake_case (`cpuReclaimThresholdPercent` → `cpu_reclaim_threshold_percent`), except
`metricAggregatePolicy.durations`, flattened to whole seconds. Optional caps are None when unset. `extensions` is
Koordinator's third-party map, carried through untouched.
"""

from __future__ import annotations

from typing import Any

import msgspec

USAGE, REQUEST, MAX_USAGE_REQUEST = "usage", "request", "maxUsageRequest"
MID_RECLAIM_STATIC = "static"


class ColocationStrategy(msgspec.Struct, frozen=True, kw_only=True):
    """One effective strategy (cluster-wide or for one node) with every default filled in."""

    enable: bool = False
    metric_aggregate_duration_seconds: int = 300
    metric_report_interval_seconds: int = 60
    metric_aggregate_durations_seconds: tuple[int, ...] = (300, 600, 1800)
    """`metricAggregatePolicy.durations` (Go durations in the JSON), as whole seconds."""
    metric_memory_collect_policy: str = "usageWithoutPageCache"
    cpu_reclaim_threshold_percent: int = 60
    cpu_calculate_policy: str = USAGE
    memory_reclaim_threshold_percent: int = 65
    memory_calculate_policy: str = USAGE
    degrade_time_minutes: int = 15
    update_time_threshold_seconds: int = 300
    resource_diff_threshold: float = 0.1
    batch_cpu_threshold_percent: int | None = None
    batch_memory_threshold_percent: int | None = None
    mid_reclaim_mode: str | None = None
    mid_cpu_threshold_percent: int = 100
    mid_memory_threshold_percent: int = 100
    mid_unallocated_percent: int = 0
    mid_static_cpu_reserved_percent: int = 0
    mid_static_memory_reserved_percent: int = 0
    extensions: dict[str, Any] = msgspec.field(default_factory=dict)
    """`extensions`: settings of third-party plugins, merged by top-level key and otherwise left alone."""
