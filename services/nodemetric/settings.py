"""Settings of the nodemetric service (built once by the CLI; see services.common.settings.load)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

DEFAULT_SNAPSHOT_INTERVAL_SECONDS = 600.0


@dataclass(frozen=True, kw_only=True)
class NodeMetricSettings:
    ENV_PREFIX: ClassVar[str] = "KOORDBUS_NODEMETRIC_"
    """Each field from KOORDBUS_NODEMETRIC_<FIELD>, else the shared KOORDBUS_<FIELD> (services.common.settings)."""

    aggregate_duration_seconds: int = 300
    """Window of nodeUsage, systemUsage and podsMetric averages (Koordinator default 300; at least 60 is used)."""
    report_interval_seconds: int = 60
    """How often a NodeMetric status is computed per node, in event time (Koordinator default 60; at least 30)."""
    aggregate_durations_seconds: tuple[int, ...] = (300, 600, 1800)
    """Durations of aggregatedNodeUsages / aggregatedSystemUsages (Koordinator default 5m, 10m, 30m)."""
    node_memory_collect_policy: str = "usageWithoutPageCache"
    """usageWithoutPageCache | usageWithHotPageCache | usageWithPageCache."""
    stale_after_seconds: float = 180.0
    """A node whose newest sample is older than this is shown as stale (never forgotten)."""
    replay_slack_seconds: int = 120
    """Extra history replayed at start-up beyond the longest window, so the first reports are complete."""
    ingest_batch_size: int = 512
    """Messages fetched per pull; one database transaction and one publish pipeline per batch."""

    report_phase_step_seconds: int = 10
    """Nodes report at a stable per-node offset into the report interval, in slots of this many seconds (the
    agents' publish interval), so their reports spread over the interval; 0 = every node at the same instant."""
    projection_write_interval_seconds: float = 0.5
    """How often node liveness rows and NodeMetric rows are written to the database (one transaction each)."""
    liveness_grid_seconds: int = 30
    """A node's liveness row (last seen, dropped batches) is written for the batch that reaches each multiple of
    this many seconds, and for every batch that reports dropped ones: its last_seen lags the newest batch by less
    than this, for a tenth of the row writes at 10,000 nodes. 0 writes every batch."""
    projection_max_pending: int = 100_000
    """Past this many unwritten rows of one kind the consumer waits for the database."""
    instance: str = ""
    """Set on scaled-out replicas (a Deployment passes the pod name): the replica joins the nodemetric members and
    handles only its share of the node partitions (services.common.membership); empty: one replica, every node."""
    membership_ttl_seconds: float = 10.0
    """A replica not heard from for this long has left: its partitions move to the others."""
    prediction_snapshot_interval_seconds: float | None = None
    """How often each node's prod-predictor models are snapshotted to KOORD_PREDICTION; unset: every 10 minutes as
    koordlet checkpoints, or the longest aggregation window when that is shorter. At most that window: a restarted
    or rebalanced replica restores the snapshot and retrains the rounds after it from the history it replays
    anyway, so no training is lost. The nodes are saved a tenth at a time, a tenth of the interval apart
    (services.nodemetric.snapshots)."""

    def __post_init__(self) -> None:
        if self.liveness_grid_seconds < 0:
            raise ValueError("liveness_grid_seconds must not be negative")
        if self.aggregate_duration_seconds <= 0 or self.report_interval_seconds <= 0:
            raise ValueError("aggregate_duration_seconds and report_interval_seconds must be positive")
        if not self.aggregate_durations_seconds or min(self.aggregate_durations_seconds) <= 0:
            raise ValueError("aggregate_durations_seconds must list positive durations")
        if self.node_memory_collect_policy not in (
            "usageWithoutPageCache",
            "usageWithHotPageCache",
            "usageWithPageCache",
        ):
            raise ValueError(f"unknown node_memory_collect_policy {self.node_memory_collect_policy!r}")
        if self.stale_after_seconds <= 0:
            raise ValueError("stale_after_seconds must be positive")
        interval = self.prediction_snapshot_interval_seconds
        if interval is not None and not 0 < interval <= self.history_seconds:
            raise ValueError(
                f"prediction_snapshot_interval_seconds must be positive and at most the longest aggregation window "
                f"({self.history_seconds} s, the history a restart replays), got {interval}"
            )

    @property
    def history_seconds(self) -> int:
        """The longest aggregation window: what a starting replica replays (besides replay_slack_seconds)."""
        return max((*self.aggregate_durations_seconds, self.aggregate_duration_seconds))

    @property
    def snapshot_interval_seconds(self) -> float:
        interval = self.prediction_snapshot_interval_seconds
        return min(DEFAULT_SNAPSHOT_INTERVAL_SECONDS, self.history_seconds) if interval is None else interval
