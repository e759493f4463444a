"""The profile log (stream KOORD_CCP) as the REST API reads and appends to it: the ClusterColocationProfiles koordbus
holds, one subject per profile whose last message is its current version or its tombstone
(schemas.colocation_events).

`current` reads one profile with its subject's last sequence, `all` every live one (one bounded pass: the stream holds
at most streams.MAX_STORED_PROFILES names), `stored_names` how many names the stream holds, `cluster_names` the names
of the cluster's own profiles as the bridge published them (KOORD_CLUSTER), to say which the log's shadow. `put` and
`delete` append with optimistic concurrency on the profile's subject (`expected_seq`: the last sequence the caller
read, 0 for a subject never written), so of two writers that read the same version only one is stored (ConflictError
for the other); the msg id is the profile's name and the request's command id, so a retried request is stored once.
Errors stay the bus's (BusUnavailableError, ConflictError; RemoteError when a stored message is not a profile event).
Built by services.webhook.component for services.webhook.routes.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from bus import streams, subjects
from bus.api import Bus, Delivery, PublishAck, PublishOptions, msg_id
from bus.errors import RemoteError
from schemas.cluster import ColocationProfile, ColocationProfileObserved
from schemas.colocation_events import (
    PROFILE_EVENT_DECODER,
    ColocationProfileDeleted,
    ColocationProfileSet,
    ProfileEvent,
)
from services.webhook.state import is_mirror_copy


@dataclass(frozen=True, kw_only=True)
class StoredProfile:
    """A profile as the log holds it: `seq` is its stream sequence (the REST API's resourceVersion)."""

    profile: ColocationProfile
    seq: int
    actor: str
    time: float
    command_id: str = ""


_OBSERVED = msgspec.json.Decoder(ColocationProfileObserved)


class ProfileClient:
    def __init__(self, bus: Bus, *, clock: Callable[[], float] = time.time) -> None:
        self._bus = bus
        self._clock = clock

    async def current(self, name: str) -> tuple[int, StoredProfile | None]:
        """(the subject's last sequence, 0 when never written; the profile, None when absent or deleted)."""
        delivery = await self._bus.last_on_subject(streams.KOORD_CCP, subjects.colocation_profile(name))
        if delivery is None:
            return 0, None
        return delivery.stream_seq, _stored(delivery)

    async def all(self) -> list[StoredProfile]:
        """Every live profile, in name order."""
        deliveries = await self._bus.read_recent(
            streams.KOORD_CCP, subjects.PROFILES_ALL, since=0.0, limit=streams.MAX_STORED_PROFILES
        )
        latest: dict[str, StoredProfile | None] = {}
        for delivery in deliveries:  # oldest first: a later message of a subject replaces an earlier one
            latest[delivery.subject] = _stored(delivery)
        return sorted((p for p in latest.values() if p is not None), key=lambda p: p.profile.metadata.name)

    async def cluster_names(self) -> list[str]:
        """The names of the cluster's own profiles, as the bridge last published them (KOORD_CLUSTER), in order."""
        deliveries = await self._bus.read_recent(
            streams.KOORD_CLUSTER, subjects.CLUSTER_PROFILES, since=0.0, limit=streams.MAX_STORED_PROFILES
        )
        live: dict[str, bool] = {}
        for delivery in deliveries:
            try:
                seen = _OBSERVED.decode(delivery.data)
            except (msgspec.ValidationError, msgspec.DecodeError):
                continue  # the webhook dead-letters it; it applies nothing
            live[seen.name] = not seen.deleted and seen.profile is not None and not is_mirror_copy(seen.profile)
        return sorted(name for name, alive in live.items() if alive)

    async def stored_names(self) -> int:
        """How many profile names the stream holds, deleted ones included."""
        count, _ = await self._bus.stream_info(streams.KOORD_CCP)
        return count

    async def put(self, profile: ColocationProfile, *, expected_seq: int, actor: str, command_id: str) -> PublishAck:
        name = profile.metadata.name
        event = ColocationProfileSet(name=name, profile=profile, actor=actor, time=self._clock(), command_id=command_id)
        return await self._append(name, event, expected_seq=expected_seq, command_id=command_id)

    async def delete(self, name: str, *, expected_seq: int, actor: str, command_id: str) -> PublishAck:
        event = ColocationProfileDeleted(name=name, actor=actor, time=self._clock(), command_id=command_id)
        return await self._append(name, event, expected_seq=expected_seq, command_id=command_id)

    async def _append(self, name: str, event: ProfileEvent, *, expected_seq: int, command_id: str) -> PublishAck:
        return await self._bus.publish(
            subjects.colocation_profile(name),
            msgspec.json.encode(event),
            msg_id=msg_id("ccp", name, command_id),
            options=PublishOptions(expected_last_subject_seq=expected_seq),
        )


def _stored(delivery: Delivery) -> StoredProfile | None:
    try:
        event = PROFILE_EVENT_DECODER.decode(delivery.data)
    except (msgspec.ValidationError, msgspec.DecodeError) as err:
        where = f"message {delivery.stream_seq} of {streams.KOORD_CCP}"
        raise RemoteError(f"{where} is not a profile event: {err}") from None
    match event:
        case ColocationProfileSet(profile=profile, actor=actor, time=at, command_id=command_id):
            return StoredProfile(profile=profile, seq=delivery.stream_seq, actor=actor, time=at, command_id=command_id)
        case ColocationProfileDeleted():
            return None
