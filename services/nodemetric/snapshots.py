"""The nodes' prod-predictor models kept on the bus: snapshots to KOORD_PREDICTION, read back by the next owner.

Called by services.nodemetric.service: `restore` when a replica starts or gains partitions (before its ingest replays
the history, whose training rounds after each snapshot's `trained_until` then continue the models), `SnapshotWriter`
every `prediction_snapshot_interval_seconds` and once more at a clean stop. A snapshot that does not decode or does
not fit the histograms is skipped with a warning (that node starts cold); nothing else is lost.

The periodic snapshots are spread over the interval: the nodes fall in PARTS parts by a hash of their name, and the
service saves one part every interval / PARTS, so each node is still snapshotted once per interval. Every node's
snapshot is taken and encoded at once, then the writer yields to the event loop: taking all 10,000 nodes' snapshots
in one go was about 10 s of CPU with the ingest stalled behind it.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
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
PARTS = 10
"""The parts the periodic snapshots are spread over: at the default 10-minute interval, a tenth of the nodes a
minute."""


def part_of(node: str, parts: int = PARTS) -> int:
    """The part (0 … parts − 1) `node` is saved with: a hash of its name, so it stays in one part while it lives."""
    return zlib.crc32(node.encode()) % parts


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
    """Publishes the snapshot of every node (or of one part's nodes) trained since its last one."""

    bus: Bus
    saved: dict[str, float] = field(default_factory=dict)
    """Node → the `trained_until` of its last snapshot."""
    parts: int = PARTS

    async def save(self, predictors: Mapping[str, NodePredictor], *, now: float, part: int | None = None) -> int:
        """Snapshot the nodes trained since their last snapshot, only those of `part` when given (see part_of);
        how many were published. Yields to the event loop after each node's snapshot."""
        due = [
            (node, predictor)
            for node, predictor in predictors.items()
            if predictor.trained_until is not None
            and predictor.trained_until > self.saved.get(node, -1.0)
            and (part is None or part_of(node, self.parts) == part)
        ]
        for start in range(0, len(due), PUBLISH_CHUNK):
            messages: list[tuple[str, bytes, str]] = []
            trained: list[tuple[str, float]] = []
            for node, predictor in due[start : start + PUBLISH_CHUNK]:
                # taken and encoded at once: ingest trains the predictors in between, and while the publish waits
                snapshot = predictor.snapshot(node, taken_at=now)
                messages.append(
                    (
                        subjects.prediction_models(node),
                        encode_snapshot(snapshot),
                        msg_id("prediction.models", node, snapshot.trained_until),
                    )
                )
                trained.append((node, snapshot.trained_until))
                await asyncio.sleep(0)
            await self.bus.publish_many(messages)
            self.saved.update(trained)
        return len(due)

    def forget(self) -> None:
        """After a rebalance: what this replica saved says nothing about the nodes it owns now."""
        self.saved.clear()
