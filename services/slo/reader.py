"""Reads of node QoS state for the API: a node's NodeSLO from the KOORD_SLO bucket, the slo-controller-config's
errors, and a node's recent ActuationApplied events from KOORD_NODE; for the watermarks view, the ConfigMap as the
bridge last published it (KOORD_CLUSTER) and the WatermarksInEffect the scheduler and descheduler stated.
`publish_watermarks` is how those services state them.

A thin shell over bus.api.Bus; nothing is cached, every call reads the bus. Values that do not decode are skipped
and counted in `unreadable` (an agent of another version may publish fields we do not know; msgspec ignores
unknown fields, so this is only for damaged messages).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import msgspec

from bus import streams, subjects
from bus.api import Bus, msg_id
from bus.errors import BusError
from schemas.cluster import CLUSTER_EVENT_DECODER, ConfigMapObserved
from schemas.qos import (
    ACTUATION_DECODER,
    NODE_SLO_DECODER,
    SLO_CONFIG_STATUS_DECODER,
    WATERMARKS_IN_EFFECT_DECODER,
    ActuationApplied,
    NodeSloRendered,
    SloConfigStatus,
    WatermarksInEffect,
)
from services.slo.service import is_delete_marker

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

    async def configmap(self, namespace: str, name: str) -> ConfigMapObserved | None:
        """The ConfigMap as the bridge last published it; None when it never did (or the bridge saw it deleted)."""
        stored = await self._bus.last_on_subject(streams.KOORD_CLUSTER, subjects.cluster_configmap(namespace, name))
        if stored is None:
            return None
        try:
            seen = CLUSTER_EVENT_DECODER.decode(stored.data)
        except msgspec.DecodeError:
            self.unreadable += 1
            return None
        return seen if isinstance(seen, ConfigMapObserved) and not seen.deleted else None

    async def watermarks_in_effect(self) -> dict[str, WatermarksInEffect]:
        """service → the watermarks it last stated."""
        found: dict[str, WatermarksInEffect] = {}
        for service in ("loadaware", "descheduler"):
            stored = await self._bus.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_watermarks(service))
            if stored is None or is_delete_marker(stored):
                continue
            try:
                found[service] = WATERMARKS_IN_EFFECT_DECODER.decode(stored.data)
            except msgspec.DecodeError:
                self.unreadable += 1
        return found

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


_WATERMARKS_ENCODER = msgspec.json.Encoder()


async def publish_watermarks(bus: Bus, stated: WatermarksInEffect) -> bool:
    """Put what a service decides with on its `_watermarks-<service>` key; False (logged) when the bus refused."""
    subject = subjects.slo_watermarks(stated.service)
    data = _WATERMARKS_ENCODER.encode(stated)
    try:
        await bus.publish(subject, data, msg_id=msg_id(subject, data.decode()))
    except BusError as e:
        log.warning("%s: could not state its watermarks on %s: %s", stated.service, subject, e)
        return False
    return True
