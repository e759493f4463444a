"""When the bus itself retries a publish, and how long it waits: what a JetStream cluster answers while it moves a
stream's leadership (an election after a server is lost takes seconds) is retried here, with backoff, so a caller
sees a slower publish rather than an error. Pure (no I/O, clock or randomness: the caller passes the attempt and
the jitter); bus.jetstream applies it.

Safe to retry: an answer saying nothing was stored — no responders (no stream leader holds the subject's interest
during an election), "JetStream system temporarily unavailable", "stream is offline", "expected last sequence per
subject temporarily unavailable", "duplicate message id is in process" (a replicated stream's answer to a publish
whose msg id another publish is still storing: two replicas that both briefly own a partition publish the same
decision; the retry is acked as that other copy's duplicate, or stored if it failed). Safe only with a
Nats-Msg-Id: a publish whose answer never came (a timeout, the connection lost under it), which may have been
stored — the stream's duplicate window turns the second copy into a duplicate ack. Anything else (a wrong last
sequence included) is the caller's to handle.
"""

from __future__ import annotations

from enum import Enum

PUBLISH_RETRY_SECONDS = 20.0
"""How long a publish keeps being retried: past a stream leader's election (nats-server's election timeouts are a
few seconds; tests/faults/test_cluster_failover.py measures the whole failover), short of an agent's or a consumer's
own retry."""
BACKOFF_SECONDS = (0.05, 0.1, 0.25, 0.5, 1.0)
"""The delay before each retry, the last repeated."""
JITTER = 0.3
"""Each delay is shortened by up to this share, so publishers failing together do not retry together."""
ERR_CLUSTER_NOT_AVAILABLE = 10008
"""JetStream's "JetStream system temporarily unavailable"."""
ERR_DUPLICATE_IN_PROCESS = 10158
"""JetStream's "duplicate message id is in process" (a replicated stream proposing another copy of it)."""
TEMPORARY_DESCRIPTIONS = ("temporarily unavailable", "is offline", "can not handle request", "peer offline")
"""Words of JetStream's error descriptions for a stream or cluster that cannot take the request now (several
codes, some newer than others; the words are stable). "peer offline": a stream placed while a server is not yet
(or no longer) known online."""


class Failure(Enum):
    NO_RESPONDERS = "no responders"
    """Nothing listened: not stored."""
    UNAVAILABLE = "temporarily unavailable"
    """JetStream said it cannot take it now: not stored."""
    NO_ANSWER = "no answer"
    """A timeout or a lost connection: maybe stored."""


def temporary_api_error(code: int | None, description: str) -> bool:
    """Whether a JetStream API error says "not now" rather than "never"."""
    text = description.lower()
    temporary_codes = (ERR_CLUSTER_NOT_AVAILABLE, ERR_DUPLICATE_IN_PROCESS)
    return code in temporary_codes or any(words in text for words in TEMPORARY_DESCRIPTIONS)


def may_retry(failure: Failure, *, has_msg_id: bool) -> bool:
    return failure is not Failure.NO_ANSWER or has_msg_id


def delay(attempt: int, *, jitter: float) -> float:
    """Seconds before retry number `attempt` (1 for the first), less `jitter` (0..1) × JITTER of it."""
    base = BACKOFF_SECONDS[min(max(attempt, 1), len(BACKOFF_SECONDS)) - 1]
    return base * (1.0 - JITTER * min(max(jitter, 0.0), 1.0))
