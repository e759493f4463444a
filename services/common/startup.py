"""Waiting for a consumer's start-up replay: as long as it makes progress, up to a stall limit when it does not.

A service that rebuilds its state from a stream at start (services.noderesource) must not decide from half of it,
yet must not hang forever on a bus that stopped answering. A fixed timeout fails both ways on a large cluster (a
million pods take longer to replay than any fixed guess), so `wait_replayed` waits while the consumer's delivered
count keeps growing, logs progress, and gives up only after `stall_seconds` without a single delivery.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

from bus.api import Consumer

log = logging.getLogger(__name__)

CHECK_EVERY_SECONDS: Final = 5.0


async def wait_replayed(
    consumer: Consumer, *, what: str, stall_seconds: float, check_every: float = CHECK_EVERY_SECONDS
) -> bool:
    """True once `consumer` has nothing outstanding; False after `stall_seconds` in which it delivered nothing.
    `what` names the replay in the progress log lines."""
    loop = asyncio.get_running_loop()
    delivered = consumer.stats.delivered
    progressed_at = loop.time()
    while not await consumer.wait_idle(min(check_every, stall_seconds)):
        now = loop.time()
        if consumer.stats.delivered != delivered:
            delivered, progressed_at = consumer.stats.delivered, now
            log.info("%s: still replaying, %d events so far", what, delivered)
        elif now - progressed_at >= stall_seconds:
            return False
    return True
