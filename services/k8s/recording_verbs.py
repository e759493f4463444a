"""Record-only mode for the cluster verbs the migration executor asks for (services.k8s.verbs answers them against
a real API server).

`koordbus up --simulate-nodes` without a cluster runs the migration executor too; its verbs are answered here: a
pod is read back as the cluster stream last has it (the PodObserved the bridge, or the simulated cluster in its
place, published on KOORD_CLUSTER; gone or deleted: 404), an eviction, delete, soft eviction, Reservation or
PodMigrationJob write is recorded (the newest `keep`, shown by /api/v1/k8s/recorded-writes under "verbs") and
answered as the API server answers a successful one. `on_evict(namespace, name)` is told of each eviction or delete
so whatever stands in for the cluster (koordbus.simcluster) can carry it out; until it publishes the pod's
tombstone the pod reads as still there, as a pod terminating on a real node does. Started by koordbus.bridge.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, Final

import msgspec

from bus import streams, subjects
from bus.api import Bus
from bus.errors import BusError
from schemas import k8s_verbs as wire
from schemas.cluster import PodObserved

_POD_OBSERVED: Final = msgspec.json.Decoder(PodObserved)
HTTP_OK, HTTP_CREATED, HTTP_NOT_FOUND = 200, 201, 404


class RecordingVerbs:
    """Answers each verb without a cluster; never raises for a verb."""

    def __init__(
        self,
        bus: Bus,
        *,
        keep: int = 1000,
        on_evict: Callable[[str, str], Awaitable[None]] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.bus = bus
        self.log: deque[dict[str, Any]] = deque(maxlen=keep)
        self.on_evict = on_evict
        self._clock = clock
        self._reservations: dict[str, dict[str, Any]] = {}

    async def carry_out(self, verb: wire.Verb) -> wire.VerbAnswer:
        match verb:
            case wire.GetPod(namespace=namespace, name=name):
                return await self._read_pod(namespace, name)
            case wire.GetReservation(name=name):
                reservation = self._reservations.get(name)
                if reservation is None:
                    return wire.VerbAnswer(status=HTTP_NOT_FOUND, error=f"reservation {name!r} not found")
                return wire.VerbAnswer(status=HTTP_OK, object=msgspec.Raw(msgspec.json.encode(reservation)))
            case wire.EvictPod(namespace=namespace, name=name) | wire.DeletePod(namespace=namespace, name=name):
                self._record(verb, f"{namespace}/{name}")
                if self.on_evict is not None:
                    await self.on_evict(namespace, name)
                return wire.VerbAnswer(status=HTTP_CREATED)
            case wire.SoftEvictPod(namespace=namespace, name=name):
                self._record(verb, f"{namespace}/{name}")
                return wire.VerbAnswer(status=HTTP_OK)
            case wire.CreateReservation(reservation=reservation):
                name = str((reservation.get("metadata") or {}).get("name", ""))
                self._reservations[name] = reservation
                self._record(verb, name)
                return wire.VerbAnswer(status=HTTP_CREATED)
            case wire.DeleteReservation(name=name):
                self._reservations.pop(name, None)
                self._record(verb, name)
                return wire.VerbAnswer(status=HTTP_OK)
            case wire.WriteMigrationJobStatus(name=name) | wire.DeleteMigrationJob(name=name):
                self._record(verb, name)
                return wire.VerbAnswer(status=HTTP_OK)
        return wire.VerbAnswer(error=f"verb {wire.verb_name(verb)} is not recorded")

    async def _read_pod(self, namespace: str, name: str) -> wire.VerbAnswer:
        try:
            last = await self.bus.last_on_subject(streams.KOORD_CLUSTER, subjects.cluster_pod(namespace, name))
        except BusError as err:
            return wire.VerbAnswer(error=f"the cluster stream cannot be read: {err}")
        observed = None
        if last is not None:
            try:
                observed = _POD_OBSERVED.decode(last.data)
            except msgspec.MsgspecError:
                observed = None
        if observed is None or observed.deleted or observed.pod is None:
            return wire.VerbAnswer(status=HTTP_NOT_FOUND, error=f'pods "{name}" not found')
        return wire.VerbAnswer(status=HTTP_OK, object=msgspec.Raw(msgspec.json.encode(observed.pod)))

    def _record(self, verb: wire.Verb, target: str) -> None:
        self.log.append({"at": self._clock(), "verb": wire.verb_name(verb), "target": target})

    def export(self) -> list[dict[str, Any]]:
        return list(self.log)
