"""Settings of the noderesource service (built once by the CLI; see services.common.settings.load).

The colocation strategy itself (thresholds, degradeTimeMinutes, updateTimeThresholdSeconds …) is not a setting:
it comes from the `slo-controller-config` ConfigMap through KOORD_CLUSTER. These only shape the shell.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from services.noderesource.smoothing import SmoothingPolicy


@dataclass(frozen=True, kw_only=True)
class NodeResourceSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_NODERESOURCE_"
    """Each field from KOORDBUS_NODERESOURCE_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    resync_interval_seconds: float = 60.0
    """How often every node is decided again without an event, so a NodeMetric that stops arriving degrades the
    node after degradeTimeMinutes and a due write is re-sent after updateTimeThresholdSeconds (Koordinator's
    default 300 s); keep it well below both."""
    batch_size: int = 512
    """Messages fetched per pull; the nodes they touch are decided once per fetched batch."""
    decide_linger_seconds: float = 0.1
    """After a fetched batch smaller than batch_size, the cluster and NodeMetric consumers wait this long before the
    next fetch: events arriving meanwhile are decided and published together (fewer, larger publishes) at the cost
    of up to this much latency."""
    projection_linger_seconds: float = 0.5
    """The same for the projector: decisions are written to the database in fewer, larger transactions (a
    transaction costs milliseconds of CPU whatever its size)."""
    startup_timeout_seconds: float = 60.0
    """start() waits for the replay of the current cluster state, NodeMetrics and last decisions as long as it
    makes progress; after this many seconds without a single event replayed it starts deciding with what it has
    (and logs a warning)."""
    smoothing_max_decrease_percent_per_minute: float = 0.0
    """Opt-in, beyond Koordinator: batch/mid may fall by at most this share of node capacity per minute since the
    last write (rises apply at once); 0 keeps Koordinator's numbers. See services.noderesource.smoothing."""
    smoothing_floor_at_batch_requests: bool = False
    """Opt-in, beyond Koordinator: batch-cpu/batch-memory never fall below what the node's running and pending pods
    request of them (removals on disable or stale NodeMetrics still apply)."""
    history_limit: int = 100
    """Decisions kept per node in the database for GET /api/v1/nodes/{node}/resources/history (older ones are pruned
    as new ones are projected); the composition root passes it to NodeResourceStore."""
    instance: str = ""
    """Set on scaled-out replicas (a Deployment passes the pod name): the replica joins the noderesource members and
    decides only the nodes of its share of the node partitions (services.common.membership); empty: one replica,
    every node."""
    membership_ttl_seconds: float = 10.0
    """A replica not heard from for this long has left: its partitions move to the others."""

    def __post_init__(self) -> None:
        if self.resync_interval_seconds <= 0:
            raise ValueError("resync_interval_seconds must be positive")
        if self.batch_size <= 0:
            raise ValueError("batch_size must be positive")
        if self.startup_timeout_seconds <= 0:
            raise ValueError("startup_timeout_seconds must be positive")
        if self.decide_linger_seconds < 0 or self.projection_linger_seconds < 0:
            raise ValueError("linger seconds must not be negative")
        if self.history_limit < 1:
            raise ValueError("history_limit must be at least 1")
        if self.membership_ttl_seconds <= 0:
            raise ValueError("membership_ttl_seconds must be positive")
        self.smoothing()  # validates the smoothing fields

    def smoothing(self) -> SmoothingPolicy:
        return SmoothingPolicy(
            max_decrease_percent_per_minute=self.smoothing_max_decrease_percent_per_minute,
            floor_at_batch_requests=self.smoothing_floor_at_batch_requests,
        )
