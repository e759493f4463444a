"""Writing the latest intent per object to the cluster, never from a consumer: the mirrors' shared write loop.

`LatestWriter.offer(key, intent)` puts an intent in a pending map (a newer one replaces an unwritten older one) and
a writer task drains it, writing each key at most once every `interval` seconds, and no sooner than `delay` seconds
after an intent arrived for a key with nothing pending, through the `write` callback (which returns the action
taken: created / updated / unchanged / deleted …). A write that raises WriteFailedError is kept
and retried with capped exponential backoff (with jitter) until it succeeds; a newer intent offered meanwhile replaces
it but keeps its backoff (failures count and retry time), so intents arriving faster than the retries do not turn
into one write each while the API server fails (a write storm the fault tests showed, tests/faults/). A
non-retryable failure or any other exception is logged and dropped. After `unhealthy_after` consecutive failures
`healthy` is False until one succeeds (for /readyz). `Mirror` wraps it with the consumer that feeds it: the base of
services.k8s.quota_mirror, services.k8s.nodeslo_mirror and services.k8s.topology_mirror.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter

from bus.api import Bus, Consumer, ConsumerSpec, Handler
from services.common import observe
from services.common.tasks import cancel_and_wait
from services.k8s import core, instruments
from services.k8s.settings import K8sSettings
from services.k8s.sinks import WriteFailedError
from services.k8s.writes import WriteHealth

log = logging.getLogger(__name__)

Intent = TypeVar("Intent")


class LatestWriter(Generic[Intent]):
    def __init__(
        self,
        what: str,
        write: Callable[[str, Intent], Awaitable[str]],
        *,
        interval: float,
        delay: float = 0.0,
        backoff_initial: float,
        backoff_max: float,
        unhealthy_after: int,
        on_action: Callable[[str], None] = lambda action: None,
        clock: Callable[[], float] = time.monotonic,
        jitter: Callable[[], float] = random.random,
    ) -> None:
        self._what = what
        self._write_fn = write
        self._interval = interval
        self._delay = delay
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self._jitter = jitter
        self._on_action = on_action
        self._clock = clock
        self._summary = instruments.WriteSummary(f"{what} writer", log, clock=clock)
        self._pending: dict[str, Intent] = {}
        self._not_before: dict[str, float] = {}
        self._failures: dict[str, int] = {}
        self._last_write: dict[str, float] = {}
        self._writing = 0
        """Writes under way (taken from the pending map, not answered yet)."""
        self._wake = asyncio.Event()
        self.health = WriteHealth(unhealthy_after)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"{self._what}-writer")

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
            self._task = None

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def wait_drained(self, deadline: float) -> bool:
        """True once nothing waits to be written and no write is under way; False at `deadline` (event loop
        time)."""
        loop = asyncio.get_running_loop()
        while self._pending or self._writing:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def offer(self, key: str, intent: Intent) -> None:
        """Write `intent` for `key` as soon as the interval since its last write and the delay since the first
        intent still pending allow, or, while the key's writes are failing, at its next retry (the newer intent
        takes the older one's place, its delay and its backoff)."""
        waiting = key in self._pending
        self._pending[key] = intent
        last = self._last_write.get(key)
        now = self._clock()
        earliest = now if last is None else max(now, last + self._interval)
        if not waiting:
            earliest = max(earliest, now + self._delay)
        if waiting or self._failures.get(key):
            earliest = max(earliest, self._not_before.get(key, now))
        self._not_before[key] = earliest
        self._wake.set()

    async def _run(self) -> None:
        while True:
            now = self._clock()
            due = [key for key, at in self._not_before.items() if at <= now and key in self._pending]
            for key in sorted(due):
                await self._write(key)
            waits = [at - self._clock() for key, at in self._not_before.items() if key in self._pending]
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.0, min(waits)) if waits else None)

    async def _write(self, key: str) -> None:
        intent = self._pending.pop(key)
        self._writing += 1
        try:
            action = await self._write_fn(key, intent)
        except WriteFailedError as e:
            self._failed(key, intent, str(e), retry=e.retry)
            return
        except Exception as e:  # a bug or a malformed intent must not stop the writer
            log.exception("%s: writing %s failed", self._what, key)
            self._failed(key, intent, f"{type(e).__name__}: {e}", retry=False)
            return
        finally:
            self._writing -= 1
        self.health.succeeded()
        self._failures.pop(key, None)
        self._last_write[key] = self._clock()
        self._on_action(action)
        self._summary.count(self._what, action)
        if action != "unchanged":
            log.debug("%s: %s %s", self._what, key, action)

    def _failed(self, key: str, intent: Intent, reason: str, *, retry: bool) -> None:
        self.health.failed(reason)
        self._on_action("failed")
        self._summary.count(self._what, "failed")
        if not retry:  # a newer intent, if one came meanwhile, is written as usual
            log.warning("%s: %s: %s (not retried)", self._what, key, reason)
            return
        failures = self._failures.get(key, 0) + 1
        self._failures[key] = failures
        delay = core.backoff_delay(
            failures, initial=self._backoff_initial, maximum=self._backoff_max, jitter=self._jitter()
        )
        log.warning("%s: %s: %s (%d in a row, retrying in %.1f s)", self._what, key, reason, failures, delay)
        self._pending.setdefault(key, intent)  # a newer intent offered meanwhile replaces this one
        self._not_before[key] = max(self._not_before.get(key, 0.0), self._clock() + delay)
        self._wake.set()


class Mirror(Generic[Intent]):
    """A consumer whose handler offers intents to a LatestWriter: what the quota and NodeSLO mirrors share — the
    durable consumer (reset at start, last value per subject), the writer task, health for /readyz and wait_idle
    for tests. A subclass gives the consumer spec, the handler, and `_write(key, intent) -> action`."""

    def __init__(
        self,
        bus: Bus,
        *,
        what: str,
        metric: str,
        settings: K8sSettings,
        registry: CollectorRegistry,
        delay: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`delay`: how long after a change arrives it is written at the earliest (LatestWriter)."""
        self.bus = bus
        self._what = what
        self._registry = registry
        self._consumer: Consumer | None = None
        writes = Counter(metric, f"{what} writes by outcome", ["action"], registry=registry)
        kube_writes = instruments.kube_writes(registry).labels  # object: the kind in lower case, e.g. nodeslo

        def count(action: str) -> None:
            writes.labels(action=action).inc()
            kube_writes(object=what.lower(), outcome=action).inc()

        self._writer: LatestWriter[Intent] = LatestWriter(
            f"{what} mirror",
            self._write,
            interval=settings.quota_write_interval_seconds,
            delay=delay,
            backoff_initial=settings.backoff_initial_seconds,
            backoff_max=settings.backoff_max_seconds,
            unhealthy_after=settings.unhealthy_after_write_failures,
            on_action=count,
            clock=clock,
        )

    def _consumer_spec(self) -> ConsumerSpec:
        raise NotImplementedError

    def _handler(self) -> Handler:
        raise NotImplementedError

    async def _write(self, key: str, intent: Intent) -> str:
        raise NotImplementedError

    async def start(self) -> None:
        spec = self._consumer_spec()
        consumer = self.bus.consume(spec, self._handler(), reset=True)
        self._consumer = observe.watch_consumer(self._registry, spec, consumer)
        self._writer.start()

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
            observe.retire_consumer(self._registry, self._consumer_spec())
            self._consumer = None
        await self._writer.stop()

    def healthy(self) -> bool:
        return self._writer.health.healthy

    async def readiness(self) -> str | None:
        if self._writer.health.healthy:
            return None
        return f"{self._what} writes failing: {self._writer.health.last_error}"

    @property
    def pending(self) -> int:
        return self._writer.pending

    async def wait_idle(self, timeout: float) -> bool:
        """True once the consumer is drained and nothing waits to be written (tests)."""
        deadline = asyncio.get_running_loop().time() + timeout
        if self._consumer is not None and not await self._consumer.wait_idle(timeout):
            return False
        return await self._writer.wait_drained(deadline)
