"""The watermarks each load decider states it uses, on the bus: `publish_watermarks` is how the load-aware
scheduler (services.loadaware) and the descheduler (services.migration) state theirs, on their `_watermarks-<service>`
key of the KOORD_SLO bucket; `WatermarkReader` is how the API's watermarks view (services.api.watermarks) reads them
back, with the slo-controller-config ConfigMap as the bridge last published it (KOORD_CLUSTER).

A thin shell over bus.api.Bus; nothing is cached, every call reads the bus. Values that do not decode are skipped
and counted in `unreadable` (only for damaged messages: msgspec ignores fields it does not know).
"""

from __future__ import annotations

import logging

import msgspec

from bus import streams, subjects
from bus.api import Bus, msg_id
from bus.errors import BusError
from schemas.cluster import CLUSTER_EVENT_DECODER, ConfigMapObserved
from schemas.qos import WATERMARKS_IN_EFFECT_DECODER, WatermarksInEffect
from services.common.kv import is_delete_marker

log = logging.getLogger(__name__)

_STATING_SERVICES = ("loadaware", "descheduler")
"""The services that state their watermarks (WatermarksInEffect.service)."""

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


class WatermarkReader:
    def __init__(self, bus: Bus) -> None:
        self._bus = bus
        self.unreadable = 0

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
        for service in _STATING_SERVICES:
            stored = await self._bus.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_watermarks(service))
            if stored is None or is_delete_marker(stored):
                continue
            try:
                found[service] = WATERMARKS_IN_EFFECT_DECODER.decode(stored.data)
            except msgspec.DecodeError:
                self.unreadable += 1
        return found
