"""Settings of the noderesource service (built once by the CLI; see services.common.settings.load).

The colocation strategy itself (thresholds, degradeTimeMinutes, updateTimeThresholdSeconds …) is not a setting:
it comes from the `slo-controller-config` ConfigMap through KOORD_CLUSTER. These only shape the shell.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class NodeResourceSettings:
    resync_interval_seconds: float = 60.0
    """How often every node is decided again without an event, so a NodeMetric that stops arriving degrades the
    node after degradeTimeMinutes and a due write is re-sent after updateTimeThresholdSeconds (Koordinator's
    default 300 s); keep it well below both."""
    batch_size: int = 512
    """Messages fetched per pull; the nodes they touch are decided once per fetched batch."""
    startup_timeout_seconds: float = 60.0
    """How long start() waits for the replay of the current cluster state, NodeMetrics and last decisions before
    it starts deciding with what it has."""

    def __post_init__(self) -> None:
        if self.resync_interval_seconds <= 0:
            raise ValueError("resync_interval_seconds must be positive")
        if self.batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if self.startup_timeout_seconds <= 0:
            raise ValueError("startup_timeout_seconds must be positive")
