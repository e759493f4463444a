"""Reads of node QoS state for the API (services.slo.routes): a node's NodeSLO from the KOORD_SLO bucket, the
slo-controller-config's errors, and a node's recent ActuationApplied events from KOORD_NODE. The watermarks the
scheduler and the descheduler state are read with services.common.watermark_feed.

A thin shell over bus.api.Bus; nothing is cached, every call reads the bus. Values that do not decode are skipped
and counted in `unreadable` (an agent of another version may publish fields we do not know; msgspec ignores
unknown fields, so this is only for damaged messages).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec

from bus import streams, subjects
from bus.api import Bus
from schemas.qos import (
    ACTUATION_DECODER,
    NODE_SLO_DECODER,
    SLO_CONFIG_STATUS_DECODER,
    ActuationApplied,
    NodeSloRendered,
    SloConfigStatus,
)
from services.common.kv import is_delete_marker

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredSlo:
    value: NodeSloRendered
    revision: int
    """The key's revision (KV_KOORD_SLO stream sequence)."""


@dataclass(frozen=True)
class StoredActuation:
    event: ActuationApplied
    seq: int
    """KOORD_NODE stream sequence."""


class SloReader:
    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.unreadable = 0

    async def node_slo(self, node: str) -> StoredSlo | None:
        """The node's rendered NodeSLO; None when the node has none (unknown, or deleted)."""
        stored = await self._bus.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(node))
        if stored is None or is_delete_marker(stored):
            return None
        try:
            return StoredSlo(NODE_SLO_DECODER.decode(stored.data), stored.stream_seq)
        except msgspec.DecodeError as e:
            self.unreadable += 1
            log.warning("slo: node %s: unreadable NodeSLO in the bucket: %s", node, e)
            return None

    async def config_status(self) -> SloConfigStatus | None:
        stored = await self._bus.last_on_subject(streams.KV_KOORD_SLO, subjects.SLO_CONFIG_STATUS)
        if stored is None:
            return None
        try:
            return SLO_CONFIG_STATUS_DECODER.decode(stored.data)
        except msgspec.DecodeError:
            self.unreadable += 1
            return None

    async def actuations(self, node: str, *, since: float, limit: int) -> list[StoredActuation]:
        """The node's newest `limit` ActuationApplied events stored since `since`, oldest first."""
        out: list[StoredActuation] = []
        for stored in await self._bus.read_recent(
            streams.KOORD_NODE, subjects.stored(subjects.node_actuation(node)), since=since, limit=limit
        ):
            try:
                out.append(StoredActuation(ACTUATION_DECODER.decode(stored.data), stored.stream_seq))
            except msgspec.DecodeError:
                self.unreadable += 1
        return out
