"""The consumer loop both buses share: handler outcome → ack / nak / term + dead-letter, in one place.

`bus.memory` and `bus.jetstream` each supply a `Source` (fetch a batch, report what is still
outstanding) whose fetched items carry an `Acker`; `LoopConsumer` drives the handler over them
and implements `bus.api.Consumer`. `decide` is the retry policy the architecture promises
(TemporaryError → nak(delay), PermanentError or a msgspec decode/validation error → term and a
copy to `koord.v1.dlq.<service>`, anything else → temporary), kept pure so it is tested alone.
The loop also keeps the consumer's observations in its `ConsumerStats` (delivery-to-ack seconds, event age at
handling, the lag the server reports with each message) and marks each message as the one being handled
(`bus.event_context`) from its handler call until it is settled, so log lines can name it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

import msgspec

from bus import event_context, subjects
from bus.api import (
    HEADER_DLQ_CONSUMER,
    HEADER_DLQ_REASON,
    HEADER_DLQ_STREAM_SEQ,
    HEADER_DLQ_SUBJECT,
    ConsumerSpec,
    ConsumerStats,
    Delivery,
    Handler,
)
from bus.errors import PermanentError, TemporaryError

log = logging.getLogger(__name__)

MAX_REASON_CHARS = 1000
UNEXPECTED_ERROR_DELAY_SECONDS = 1.0
FLUSH_FAILURE_DELAY_SECONDS = 1.0
FETCH_BACKOFF_SECONDS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
IDLE_POLL_SECONDS = 0.05
FLUSH_RETRY_INITIAL_SECONDS = 0.5
FLUSH_RETRY_MAX_SECONDS = 5.0
"""Retries in place (ConsumerSpec.retry_flush_in_place): a recovered database is used again within this long."""
FLUSH_RETRY_JITTER = 0.2
"""Each delay is shortened by up to this share, at random, so replicas failing together do not retry together."""


class Acker(Protocol):
    """Settles one fetched message on its bus."""

    async def ack(self) -> None: ...

    async def nak(self, delay: float) -> None: ...

    async def term(self) -> None: ...

    async def in_progress(self) -> None:
        """Still working on it: the server restarts the message's ack_wait instead of redelivering it."""
        ...


@dataclass(frozen=True)
class Fetched:
    delivery: Delivery
    acker: Acker


class Source(Protocol):
    """One durable consumer's view of its bus."""

    async def fetch(self) -> list[Fetched]:
        """The next batch; an empty list when nothing arrived within the fetch timeout."""
        ...

    async def outstanding(self) -> int:
        """Messages the durable has yet to deliver plus those delivered but not settled."""
        ...

    async def close(self) -> None: ...


DeadLetterPublisher = Callable[[str, bytes, str, Mapping[str, str]], Awaitable[object]]
"""(subject, data, msg_id, headers) → publish on the same bus."""


@dataclass(frozen=True)
class Retry:
    delay: float


@dataclass(frozen=True)
class DeadLetter:
    reason: str


Outcome = Retry | DeadLetter


def one_line(text: str, limit: int = MAX_REASON_CHARS) -> str:
    """Header-safe reason: no line breaks, bounded length."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


DECODE_ERRORS = msgspec.DecodeError | UnicodeDecodeError
"""A message that cannot be decoded: msgspec's errors (ValidationError included), and invalid UTF-8 in a JSON string,
which msgspec reports as a UnicodeDecodeError. Dead-lettered at once: no retry can make it decode."""


def describe(error: BaseException) -> str:
    text = str(error)
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def decide(error: Exception, *, num_delivered: int, max_deliver: int) -> Outcome:
    """What to do with a message whose handler raised `error` on its `num_delivered`-th delivery."""
    if isinstance(error, PermanentError | DECODE_ERRORS):
        return DeadLetter(one_line(describe(error)))
    delay = error.delay if isinstance(error, TemporaryError) else UNEXPECTED_ERROR_DELAY_SECONDS
    if max_deliver > 0 and num_delivered >= max_deliver:
        return DeadLetter(one_line(f"gave up after {num_delivered} deliveries: {describe(error)}"))
    return Retry(delay)


def flush_retry_delay(failures: int, *, jitter: float) -> float:
    """Delay before retrying a batch in place after `failures` consecutive failed flushes (>= 1): doubling from
    FLUSH_RETRY_INITIAL_SECONDS up to FLUSH_RETRY_MAX_SECONDS, less `jitter` (0..1) × FLUSH_RETRY_JITTER of it."""
    capped = min(FLUSH_RETRY_MAX_SECONDS, FLUSH_RETRY_INITIAL_SECONDS * 2.0 ** min(max(failures, 1) - 1, 32))
    return capped * (1.0 - FLUSH_RETRY_JITTER * min(max(jitter, 0.0), 1.0))


def dead_letter_message(delivery: Delivery, reason: str, spec: ConsumerSpec) -> tuple[str, str, dict[str, str]]:
    """(subject, msg_id, headers) of the dead-letter copy; the msg_id makes a repeated copy a duplicate."""
    headers = dict(delivery.headers)
    # The original Nats-Msg-Id would make the copy a duplicate of nothing useful; ours replaces it.
    headers.pop("Nats-Msg-Id", None)
    headers.update(
        {
            HEADER_DLQ_REASON: one_line(reason),
            HEADER_DLQ_SUBJECT: delivery.subject,
            HEADER_DLQ_STREAM_SEQ: str(delivery.stream_seq),
            HEADER_DLQ_CONSUMER: spec.durable,
        }
    )
    return subjects.dlq(spec.service), f"dlq:{spec.stream}:{delivery.stream_seq}", headers


class LoopConsumer:
    """A running consumer: fetch → handle each → flush → settle, until stopped. Never dies on an error."""

    def __init__(
        self, source: Source, handler: Handler, spec: ConsumerSpec, *, publish_dead_letter: DeadLetterPublisher
    ) -> None:
        self._source = source
        self._handler = handler
        self._spec = spec
        self._publish_dead_letter = publish_dead_letter
        self._stats = ConsumerStats()
        self._stopping = False
        self._in_batch = False
        self._task = asyncio.create_task(self._run(), name=f"consumer:{spec.stream}:{spec.durable}")

    @property
    def stats(self) -> ConsumerStats:
        return self._stats

    @property
    def stopped(self) -> bool:
        """Its loop has ended (after `stop_soon`, once the batch in hand is settled); `stop` still closes it."""
        return self._task.done()

    def stop_soon(self) -> None:
        """Take no more: the item in hand is finished and settled, the rest of its batch handed back (`stop` still
        has to be awaited). For a process that was told to stop, before it stops each service in turn."""
        self._stopping = True

    async def stop(self) -> None:
        self._stopping = True
        if not self._in_batch:
            # Waiting in fetch holds no messages, so cancelling there loses nothing.
            self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        await self._source.close()

    async def wait_idle(self, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            if self._stopping and not self._in_batch:
                # Told to take no more (stop_soon: the process is stopping): nothing will make it idle. Waiting out
                # the timeout here cost `koordbus up` 2 s per service at every stop, past its 8 s deadline.
                return False
            # Checked on both sides of the await: a batch may be taken while the server is asked.
            if not self._in_batch and await self._outstanding() == 0 and not self._in_batch:
                return True
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(IDLE_POLL_SECONDS)

    async def _outstanding(self) -> int:
        try:
            return await self._source.outstanding()
        except Exception as e:  # an unreachable bus is simply "not idle yet"
            self._stats.last_error = describe(e)
            return 1

    async def _run(self) -> None:
        failures = 0
        while not self._stopping:
            try:
                batch = await self._source.fetch()
            except asyncio.CancelledError:
                raise
            except Exception as e:
                self._stats.fetch_errors += 1
                self._stats.last_error = one_line(describe(e))
                log.warning("consumer %s: fetch failed: %s", self._spec.durable, self._stats.last_error)
                await asyncio.sleep(FETCH_BACKOFF_SECONDS[min(failures, len(FETCH_BACKOFF_SECONDS) - 1)])
                failures += 1
                continue
            failures = 0
            if not batch:
                continue
            self._in_batch = True
            try:
                await self._process(batch)
            except Exception as e:  # settling failed (bus away): the server redelivers after ack_wait
                self._stats.last_error = one_line(describe(e))
                log.warning("consumer %s: settling a batch failed: %s", self._spec.durable, self._stats.last_error)
            finally:
                self._in_batch = False
            if self._spec.linger_seconds > 0 and len(batch) < self._spec.batch_size and not self._stopping:
                await asyncio.sleep(self._spec.linger_seconds)  # not in a batch: stop() may cancel it here

    async def _process(self, batch: list[Fetched]) -> None:
        delivered_at = time.monotonic()
        succeeded: list[Fetched] = []
        for index, item in enumerate(batch):
            if self._stopping:  # what is not handled yet goes back at once, as if never fetched: a stop is prompt
                for untouched in batch[index:]:
                    await self._nak(untouched, 0.0)
                break
            d = item.delivery
            self._stats.delivered += 1
            if d.pending >= 0:
                self._stats.pending = d.pending
            if d.published_at > 0:  # server time against ours: a clock ahead of ours must not make it negative
                self._stats.event_age_seconds.observe(max(0.0, time.time() - d.published_at))
            token = event_context.enter(
                event_context.HandlingEvent(
                    event_id=d.msg_id, subject=d.subject, stream_seq=d.stream_seq, consumer=self._spec.durable
                )
            )
            try:
                await self._handler.handle(d)
            except Exception as e:
                await self._settle_failure(item, e)
            else:
                succeeded.append(item)
            finally:
                event_context.leave(token)
        if not await self._flush():
            if self._spec.retry_flush_in_place:
                succeeded = await self._retry_in_place(succeeded)
            else:
                for item in succeeded:
                    await self._nak(item, FLUSH_FAILURE_DELAY_SECONDS)
                return
        for item in succeeded:
            await item.acker.ack()
            self._stats.acked += 1
        acked_at = time.monotonic()
        for _ in succeeded:
            self._stats.handle_seconds.observe(acked_at - delivered_at)

    async def _flush(self) -> bool:
        """Flush the handler; False (counted and logged) when it failed."""
        try:
            await self._handler.flush()
        except Exception as e:
            self._stats.flush_failures += 1
            self._stats.last_error = one_line(f"flush: {describe(e)}")
            if self._stats.flush_failures == 1 or self._stats.flush_failures % 10 == 0:
                log.warning("consumer %s: flush failed", self._spec.durable, exc_info=True)  # first, then 1 in 10
            else:
                log.warning("consumer %s: flush failed: %s", self._spec.durable, self._stats.last_error)
            return False
        return True

    async def _retry_in_place(self, batch: list[Fetched]) -> list[Fetched]:
        """Hand `batch` to the handler again and flush, with backoff, until a flush succeeds; returns the items to
        ack (a message the handler now refuses is settled as a failure and left out). When the consumer stops
        meanwhile the batch is nak'ed (redelivered at once) and nothing is returned."""
        failures = 1
        while True:
            delay = flush_retry_delay(failures, jitter=random.random())
            log.info("consumer %s: retrying a batch of %d in %.1f s", self._spec.durable, len(batch), delay)
            await self._hold(batch, delay)
            if self._stopping:
                for item in batch:
                    await self._nak(item, 0.0)
                return []
            handled: list[Fetched] = []
            for item in batch:
                try:
                    await self._handler.handle(item.delivery)
                except Exception as e:
                    await self._settle_failure(item, e)
                else:
                    handled.append(item)
            batch = handled
            if await self._flush():
                return batch
            failures += 1

    async def _hold(self, batch: list[Fetched], seconds: float) -> None:
        """Wait `seconds` (less if the consumer stops), telling the server every so often that the batch is still
        being worked on, so it is not redelivered after ack_wait while it waits (an unreachable server is retried
        at the next round; it redelivers after ack_wait at worst, which the offset-keeping store then skips)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        next_progress = loop.time()
        while not self._stopping and (left := deadline - loop.time()) > 0:
            if loop.time() >= next_progress:
                with contextlib.suppress(Exception):
                    for item in batch:
                        await item.acker.in_progress()
                next_progress = loop.time() + self._spec.ack_wait_seconds / 3
            await asyncio.sleep(min(left, IDLE_POLL_SECONDS))

    async def _settle_failure(self, item: Fetched, error: Exception) -> None:
        d = item.delivery
        self._stats.last_error = one_line(describe(error))
        expected = isinstance(error, TemporaryError | PermanentError | DECODE_ERRORS)
        if not expected:
            where = f"{self._spec.durable} on {d.subject} seq {d.stream_seq}"
            log.error("consumer %s: unexpected handler error, will retry", where, exc_info=error)
        outcome = decide(error, num_delivered=d.num_delivered, max_deliver=self._spec.max_deliver)
        match outcome:
            case Retry(delay=delay):
                await self._nak(item, delay)
            case DeadLetter(reason=reason):
                await self._dead_letter(item, reason)

    async def _nak(self, item: Fetched, delay: float) -> None:
        await item.acker.nak(delay)
        self._stats.naked += 1

    async def _dead_letter(self, item: Fetched, reason: str) -> None:
        subject, dlq_id, headers = dead_letter_message(item.delivery, reason, self._spec)
        try:
            await self._publish_dead_letter(subject, item.delivery.data, dlq_id, headers)
        except Exception as e:
            # Terming without a stored copy would lose the message: keep it and retry later.
            self._stats.last_error = one_line(f"dead-letter publish failed: {describe(e)}")
            log.error("consumer %s: %s", self._spec.durable, self._stats.last_error)
            await self._nak(item, UNEXPECTED_ERROR_DELAY_SECONDS)
            return
        await item.acker.term()
        self._stats.termed += 1
        self._stats.dead_lettered += 1
