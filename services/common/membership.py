"""Replicas of one service find each other over the bus and split the node partitions between them.

Each replica publishes a heartbeat on `koord.v1.members.<service>.<instance>` (stream KOORD_MEMBERS keeps the last
one per subject) every `heartbeat_seconds`; the live members are those heard from within `ttl_seconds`, and a
replica that stops cleanly says so at once (an empty heartbeat). `owned_partitions` is a pure round-robin over the
sorted live members, so every replica that sees the same members computes the same split — each partition is owned
by exactly one of them. While members disagree (one replica heard a newcomer first), a partition may briefly be
handled twice or not at all: callers must be idempotent (nodemetric's event-time reports and noderesource's
content-derived decisions carry deterministic msg ids) and catch up on what they gain (nodemetric replays its
longest window, noderesource the current state of the gained nodes). Used by services.nodemetric and
services.noderesource: `join` at start-up, then `follow` until stopped, `leave` on a clean stop; a replica's own
durables are named with `durable` and deleted by the server INSTANCE_DURABLE_INACTIVE_SECONDS after it went away.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from bus import streams, subjects
from bus.api import Bus
from services.common.tasks import cancel_and_wait

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 2.0
TTL_SECONDS = 10.0
INSTANCE_DURABLE_INACTIVE_SECONDS = 3600.0
"""A replica's own durables (named after its instance) are deleted by the server an hour after it went away (a
Deployment's pod names change with every pod, so old ones would otherwise stay for ever)."""


def durable(name: str, instance: str) -> str:
    """The durable `name` of the replica `instance` (the name itself without an instance: a single replica)."""
    return f"{name}-{instance}" if instance else name


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

    async def join(self, partitions: int = subjects.NODE_PARTITIONS) -> frozenset[int]:
        """Beat once and return this replica's share of `partitions` among the live members."""
        await self.beat()
        return owned_partitions(partitions, await self.members(), self.instance)

    async def follow(
        self,
        settled: Callable[[], frozenset[int] | None],
        rebalance: Callable[[frozenset[int]], Awaitable[None]],
        *,
        partitions: int = subjects.NODE_PARTITIONS,
    ) -> None:
        """Until cancelled: heartbeat every HEARTBEAT_SECONDS (in a task of its own, so a long rebalance does not
        look like a dead replica) and, after each, call `rebalance(share)` when this replica's share is not the
        one `settled()` says it handles. A failure (the bus away, a rebalance cut short) is logged and tried again
        at the next heartbeat; a rebalance that fails must leave `settled()` unchanged to be retried."""
        beats = asyncio.create_task(self._beat_forever(), name=f"{self.service}-heartbeat")
        try:
            while True:
                await asyncio.sleep(HEARTBEAT_SECONDS)
                try:
                    share = owned_partitions(partitions, await self.members(), self.instance)
                    if share != settled():
                        await rebalance(share)
                except asyncio.CancelledError:
                    raise
                except Exception as e:  # keep the partitions held, try again at the next heartbeat
                    log.warning("%s %s: following the members failed: %s", self.service, self.instance, e)
        finally:
            await cancel_and_wait(beats)

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                await self.beat()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                log.warning("%s %s: heartbeat failed: %s", self.service, self.instance, e)
