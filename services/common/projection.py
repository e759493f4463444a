"""Projecting a stream into the database: one handler shape for every service's projector consumer.

A BatchProjector decodes each delivery of a fetched batch and, at flush, hands the whole batch to the store in one
call (one transaction). A failed write raises TemporaryError so the batch is redelivered after a short delay; stores
keep an offset per consumer and skip what they already have, so a redelivery never writes anything twice.
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
