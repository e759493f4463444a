"""Replicas of one service find each other over the bus and split the node partitions between them.

Each replica publishes a heartbeat on `koord.v1.members.<service>.<instance>` (stream KOORD_MEMBERS keeps the last
one per subject) every `heartbeat_seconds`; the live members are those heard from within `ttl_seconds`, and a
replica that stops cleanly says so at once (an empty heartbeat). `owned_partitions` is a pure round-robin over the
sorted live members, so every replica that sees the same members computes the same split — each partition is owned
by exactly one of them. While members disagree (one replica heard a newcomer first), a partition may briefly be
handled twice or not at all: callers must be idempotent (nodemetric's event-time reports with deterministic msg ids
are) and catch up on what they gain (nodemetric replays its longest window).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from bus import streams, subjects
from bus.api import Bus

HEARTBEAT_SECONDS = 2.0
TTL_SECONDS = 10.0


def owned_partitions(partitions: int, members: Sequence[str], me: str) -> frozenset[int]:
    """The partitions `me` owns among `members` (`me` always counts as live): p goes to sorted(members)[p % n]."""
    live = sorted({*members, me})
    return frozenset(p for p in range(partitions) if live[p % len(live)] == me)


class Membership:
    def __init__(
        self,
        bus: Bus,
        *,
        service: str,
        instance: str,
        ttl_seconds: float = TTL_SECONDS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not instance:
            raise ValueError("a replica needs an instance name to join its service's members")
        self.bus = bus
        self.service = service
        self.instance = instance
        self.ttl_seconds = ttl_seconds
        self._clock = clock

    async def beat(self) -> None:
        at = self._clock()
        subject = subjects.member(self.service, self.instance)
        await self.bus.publish(subject, repr(at).encode(), msg_id=f"{subject}:{at!r}")

    async def leave(self) -> None:
        """Tell the others now rather than after the TTL (an empty heartbeat is a farewell)."""
        subject = subjects.member(self.service, self.instance)
        await self.bus.publish(subject, b"", msg_id=f"{subject}:left:{self._clock()!r}")

    async def members(self) -> list[str]:
        """The live instances of the service, sorted (this one included once it has beaten)."""
        since = self._clock() - self.ttl_seconds
        heard = await self.bus.read_recent(
            streams.KOORD_MEMBERS, subjects.members_of(self.service), since=since, limit=10_000
        )
        return sorted({subjects.member_instance(d.subject) for d in heard if d.data})
