"""Helpers for the bus contract suite: unique stream names per test and a recording handler."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from bus import subjects
from bus.api import ConsumerSpec, Delivery, StreamSpec


@dataclass(frozen=True)
class Names:
    """Stream, subjects and service unique to one test, so tests can share one nats-server."""

    uid: str = field(default_factory=lambda: uuid.uuid4().hex[:10])

    @property
    def stream(self) -> str:
        return f"T_{self.uid}"

    @property
    def dlq_stream(self) -> str:
        return f"D_{self.uid}"

    @property
    def service(self) -> str:
        return f"svc-{self.uid}"

    def subject(self, *tokens: str) -> str:
        return ".".join((f"t{self.uid}", *tokens))

    def stream_spec(self, **overrides: object) -> StreamSpec:
        fields: dict[str, object] = {
            "name": self.stream,
            "subjects": (self.subject(">"),),
            "max_age_seconds": 3600.0,
            "duplicate_window_seconds": 60.0,
            "storage": "memory",
        }
        fields.update(overrides)
        return StreamSpec(**fields)  # type: ignore[arg-type]

    def dlq_spec(self) -> StreamSpec:
        return StreamSpec(
            name=self.dlq_stream,
            subjects=(subjects.dlq(self.service),),
            max_age_seconds=3600.0,
            duplicate_window_seconds=60.0,
            storage="memory",
        )

    def consumer(self, durable: str = "c", **overrides: object) -> ConsumerSpec:
        fields: dict[str, object] = {
            "durable": durable,
            "stream": self.stream,
            "filter_subjects": (self.subject(">"),),
            "service": self.service,
            "ack_wait_seconds": 2.0,
            "max_deliver": 3,
            "batch_size": 16,
            "fetch_timeout_seconds": 0.2,
        }
        fields.update(overrides)
        return ConsumerSpec(**fields)  # type: ignore[arg-type]

    def dlq_consumer(self) -> ConsumerSpec:
        return ConsumerSpec(
            durable="dlq-reader",
            stream=self.dlq_stream,
            filter_subjects=(subjects.dlq(self.service),),
            service=f"{self.service}-dlq",
            ack_wait_seconds=2.0,
            fetch_timeout_seconds=0.2,
        )


class Recorder:
    """A Handler that records every delivery, optionally fails some, and commits per flushed batch."""

    def __init__(
        self, behave: Callable[[Delivery], None] | None = None, *, flush_failures: int = 0, pause: float = 0.0
    ) -> None:
        self.behave = behave
        self.pause = pause
        self.flush_failures_left = flush_failures
        self.seen: list[Delivery] = []
        self.committed: list[Delivery] = []
        self._batch: list[Delivery] = []

    async def handle(self, delivery: Delivery) -> None:
        self.seen.append(delivery)
        if self.pause:
            await asyncio.sleep(self.pause)
        if self.behave is not None:
            self.behave(delivery)
        self._batch.append(delivery)

    async def flush(self) -> None:
        batch, self._batch = self._batch, []
        if self.flush_failures_left > 0:
            self.flush_failures_left -= 1
            raise RuntimeError("database is away")
        self.committed.extend(batch)

    def committed_data(self) -> list[bytes]:
        return [d.data for d in self.committed]


async def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not met in time")
        await asyncio.sleep(0.02)
