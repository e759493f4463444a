"""Projecting a stream into the database: one handler shape for every service's projector consumer.

A BatchProjector decodes each delivery of a fetched batch and, at flush, hands the whole batch to the store in one
call (one transaction). A failed write raises TemporaryError; stores keep an offset per consumer and skip what they
already have, so a batch written twice is written once. Because they skip by offset, a projector's ConsumerSpec sets
`retry_flush_in_place`: a batch that cannot be written (the database is away) is retried as it is, with backoff,
before anything newer is fetched. Nak'ed instead, it would come back after newer batches, whose offset would then
hide it for good (a PostgreSQL outage of a few seconds lost decisions that way: tests/faults/test_postgres_outage.py).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from bus.api import Delivery
from bus.errors import TemporaryError

RETRY_DELAY_SECONDS = 1.0

T = TypeVar("T")


class BatchProjector(Generic[T]):
    def __init__(self, what: str, decode: Callable[[Delivery], T], write: Callable[[list[T]], Awaitable[object]]):
        """`what` names the projection in errors; `decode` turns a delivery into an item; `write` stores a batch."""
        self._what = what
        self._decode = decode
        self._write = write
        self._pending: list[T] = []

    async def handle(self, delivery: Delivery) -> None:
        self._pending.append(self._decode(delivery))

    async def flush(self) -> None:
        pending, self._pending = self._pending, []
        if not pending:
            return
        try:
            await self._write(pending)
        except Exception as e:  # the batch is redelivered; the store skips what it already has
            raise TemporaryError(f"{self._what} projection failed: {e}", delay=RETRY_DELAY_SECONDS) from e
