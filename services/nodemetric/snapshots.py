"""The nodes' prod-predictor models kept on the bus: snapshots to KOORD_PREDICTION, read back by the next owner.

Called by services.nodemetric.service: `restore` when a replica starts or gains partitions (before its ingest replays
the history, whose training rounds after each snapshot's `trained_until` then continue the models), `SnapshotWriter`
every `prediction_snapshot_interval_seconds` and once more at a clean stop. A snapshot that does not decode or does
not fit the histograms is skipped with a warning (that node starts cold); nothing else is lost.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgspec

from bus import streams, subjects
from bus.api import Bus, FollowFrom, msg_id
from schemas.prediction import decode_snapshot, encode_snapshot
from services.nodemetric.training import NodePredictor

log = logging.getLogger(__name__)

PUBLISH_CHUNK = 256
"""Snapshots per pipelined publish (each is tens of kilobytes at 100 pods)."""


@dataclass(frozen=True)
class Restored:
    predictors: dict[str, NodePredictor]
    unreadable: int
    """Snapshots skipped: undecodable, or inconsistent with the histograms."""


async def restore(bus: Bus, owned: frozenset[int] | None) -> Restored:
    """The last snapshot of every node in the `owned` partitions (None: every node)."""
    filters = (
        (subjects.PREDICTION_MODELS_ALL,)
        if owned is None
        else subjects.partition_filters(subjects.PREDICTION_MODELS_ALL, owned)
    )
    predictors: dict[str, NodePredictor] = {}
    unreadable = 0
    if not filters:
        return Restored(predictors, unreadable)
    follower = await bus.follow(streams.KOORD_PREDICTION, filters, FollowFrom(sequence=1))
    try:
        while True:
            batch = await follower.next()
            if not batch:
                if await follower.caught_up():
                    break
                continue
            for delivery in batch:
                try:
                    snapshot = decode_snapshot(delivery.data)
                    predictors[snapshot.node] = NodePredictor.restore(snapshot)
                except (msgspec.DecodeError, msgspec.ValidationError, ValueError) as e:
                    unreadable += 1
                    log.warning("prediction snapshot at %s skipped (that node starts cold): %s", delivery.subject, e)
            if batch[-1].pending == 0:
                break
    finally:
        await follower.close()
    return Restored(predictors, unreadable)


@dataclass
class SnapshotWriter:
    """Publishes the snapshot of every node trained since its last one."""

    bus: Bus
    saved: dict[str, float] = field(default_factory=dict)
    """Node → the `trained_until` of its last snapshot."""

    async def save(self, predictors: Mapping[str, NodePredictor], *, now: float) -> int:
        """Snapshot the nodes trained since their last snapshot; how many were published."""
        due = [
            (node, predictor)
            for node, predictor in predictors.items()
            if predictor.trained_until is not None and predictor.trained_until > self.saved.get(node, -1.0)
        ]
        for start in range(0, len(due), PUBLISH_CHUNK):
            # taken together, before the publish: ingest may train these predictors while it waits for its acks
            snapshots = [
                predictor.snapshot(node, taken_at=now) for node, predictor in due[start : start + PUBLISH_CHUNK]
            ]
            await self.bus.publish_many(
                [
                    (
                        subjects.prediction_models(snapshot.node),
                        encode_snapshot(snapshot),
                        msg_id("prediction.models", snapshot.node, snapshot.trained_until),
                    )
                    for snapshot in snapshots
                ]
            )
            for snapshot in snapshots:
                self.saved[snapshot.node] = snapshot.trained_until
        return len(due)

    def forget(self) -> None:
        """After a rebalance: what this replica saved says nothing about the nodes it owns now."""
        self.saved.clear()
