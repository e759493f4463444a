"""Request/reply sent again where that is safe: what a NATS cluster answers while it moves a server's clients or a
responder's replica (no responders, no answer in time, a connection lost under the request) is retried with bus.retry's
backoff until a time bound, so a caller sees a slower answer rather than an error.

Safe to send again: a request nobody received (no responders), always; one that may have been handled (no answer,
connection lost, the responder's own publish unacknowledged) only when the caller says so — a read, or a command
its responder recognises by an id carried in the request, which is sent again unchanged (services.quota.client: the
quota service answers a command id it has applied from its log). Used by the services' clients; the bus's own
`request` stays a single attempt.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

from bus import retry
from bus.api import Bus
from bus.errors import BusUnavailableError

NO_RESPONDERS = "no responders"
"""BusUnavailableError.reason: nobody got the request (nothing was done)."""
NO_ANSWER = "no answer"
"""BusUnavailableError.reason: no reply in time (the request may have been handled)."""
CONNECTION = "connection"
"""BusUnavailableError.reason: the connection failed under the request (it may have been handled)."""
RESPONDER = "responder unavailable"
"""BusUnavailableError.reason: the responder handled it but found the bus unavailable (its own publish got no ack
in time: it may have been stored)."""
REQUEST_RETRY_SECONDS = 30.0
"""How long a caller waits at most, retries included, by default: past a responder's failover (a replica taking
over, a server's clients reconnecting elsewhere) and a stream leader's election under the responder's own publish."""
MIN_ATTEMPT_SECONDS = 0.5
"""An attempt is not started with less time than this left: it could not be answered."""


async def request(
    bus: Bus,
    subject: str,
    data: bytes,
    *,
    attempt_timeout: float,
    within: float = REQUEST_RETRY_SECONDS,
    handled_twice_is_safe: bool,
    on_retry: Callable[[str], None] | None = None,
) -> bytes:
    """The reply to `data` on `subject`, sent again after a failure bus.rpc's docstring calls safe (given
    `handled_twice_is_safe`) while time is left of `within` seconds; each attempt waits `attempt_timeout` at most
    (less when less is left). `on_retry(reason)` is told of each retry. The last failure is raised, its message
    saying how many attempts were made and for how long; other errors (RemoteError …) at once."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    give_up_at = started + within
    attempt = 0
    while True:
        attempt += 1
        left = give_up_at - loop.time()
        try:
            return await bus.request(subject, data, timeout=min(attempt_timeout, max(left, MIN_ATTEMPT_SECONDS)))
        except BusUnavailableError as e:
            maybe_handled = e.reason in (NO_ANSWER, CONNECTION, RESPONDER)
            safe = e.reason == NO_RESPONDERS or (handled_twice_is_safe and maybe_handled)
            pause = retry.delay(attempt, jitter=random.random())
            if not safe or loop.time() + pause + MIN_ATTEMPT_SECONDS > give_up_at:
                if attempt == 1:
                    raise
                took = loop.time() - started
                raise BusUnavailableError(f"{e} (attempt {attempt}, after {took:.1f} s)", reason=e.reason) from e
            if on_retry is not None:
                on_retry(e.reason)
            await asyncio.sleep(pause)
