"""Observability shared by services: bus consumer statistics as Prometheus counters, and readiness checks.

A service calls `watch_consumers(registry, service=…, consumers=…)` when it starts its consumer
loops and `retire_consumers(…)` when it stops them (NodeMetricService does; later services will
too); the API's `/metrics` renders the registry. One `ConsumerStatsCollector` serves a registry,
so every service in a process (or one service started twice) shares the same metric families
instead of colliding on "Duplicated timeseries". Counters stay monotonic across a restart: a
retired consumer's final counts are carried into the next consumer of the same name.
`database_ready` and `bus_ready` build the checks the composition root hands to the API's `/readyz`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Final

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import streams
from bus.api import Bus, Consumer, ConsumerStats

METRIC_PREFIX: Final = "koordbus_consumer_"
LABELS: Final = ("consumer", "service")
COUNTERS: Final[Mapping[str, str]] = {
    "delivered": "Messages handed to the handler (redeliveries included)",
    "acked": "Messages acknowledged after their batch was flushed",
    "naked": "Messages negatively acknowledged for redelivery (temporary errors, failed flushes)",
    "termed": "Messages terminated: never redelivered",
    "dead_lettered": "Messages copied to koord.v1.dlq.<service> with the reason, then terminated",
    "flush_failures": "Batches whose flush failed (the batch is redelivered)",
    "fetch_errors": "Failed fetches from the bus (the loop backs off and retries)",
}
"""ConsumerStats field → help text; each becomes `koordbus_consumer_<field>_total`."""

ConsumerKey = tuple[str, str]
"""(service, consumer name)."""


def counts_of(stats: ConsumerStats) -> dict[str, int]:
    """The counter fields of one consumer's stats."""
    return {name: int(getattr(stats, name)) for name in COUNTERS}


def add_counts(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {name: a.get(name, 0) + b.get(name, 0) for name in COUNTERS}


class ConsumerStatsCollector:
    """A custom Prometheus collector over the consumers it watches; create it with `collector_for`."""

    def __init__(self) -> None:
        self._live: dict[ConsumerKey, Consumer] = {}
        self._carried: dict[ConsumerKey, dict[str, int]] = {}
        # A scrape may run on another thread (prometheus_client's own HTTP server) while a service restarts.
        self._lock = threading.Lock()

    def watch(self, *, service: str, name: str, consumer: Consumer) -> None:
        """Export `consumer`'s stats; a consumer still watched under the same key is retired first."""
        key = (service, name)
        with self._lock:
            previous = self._live.get(key)
            if previous is consumer:
                return
            if previous is not None:
                self._carry(key, previous)
            self._live[key] = consumer

    def retire(self, *, service: str, name: str) -> None:
        """Freeze the consumer's final counts; they keep being exported and a later consumer adds to them."""
        key = (service, name)
        with self._lock:
            consumer = self._live.pop(key, None)
            if consumer is not None:
                self._carry(key, consumer)

    def totals(self) -> dict[ConsumerKey, dict[str, int]]:
        """Counts per (service, consumer): carried-over counts plus the live consumer's."""
        with self._lock:
            keys = sorted(set(self._live) | set(self._carried))
            return {
                key: add_counts(
                    self._carried.get(key, {}),
                    counts_of(self._live[key].stats) if key in self._live else {},
                )
                for key in keys
            }

    def describe(self) -> list[Metric]:
        # Declares the family names so the registry rejects a second collector exporting them.
        return list(_empty_families().values())

    def collect(self) -> Iterator[Metric]:
        families = _empty_families()
        for (service, consumer), counts in self.totals().items():
            for name, family in families.items():
                family.add_metric([consumer, service], counts[name])
        yield from families.values()

    def _carry(self, key: ConsumerKey, consumer: Consumer) -> None:
        self._carried[key] = add_counts(self._carried.get(key, {}), counts_of(consumer.stats))


def _empty_families() -> dict[str, CounterMetricFamily]:
    return {
        name: CounterMetricFamily(METRIC_PREFIX + name, help_text, labels=LABELS)
        for name, help_text in COUNTERS.items()
    }


# Memo, not a plugin registry: the collector belongs to the registry it was created for and dies with it.
_COLLECTORS: weakref.WeakKeyDictionary[CollectorRegistry, ConsumerStatsCollector] = weakref.WeakKeyDictionary()
_COLLECTORS_LOCK = threading.Lock()


def collector_for(registry: CollectorRegistry) -> ConsumerStatsCollector:
    """The registry's consumer collector, registered on first use."""
    with _COLLECTORS_LOCK:
        collector = _COLLECTORS.get(registry)
        if collector is None:
            collector = ConsumerStatsCollector()
            registry.register(collector)
            _COLLECTORS[registry] = collector
        return collector


def watch_consumers(registry: CollectorRegistry, *, service: str, consumers: Mapping[str, Consumer]) -> None:
    """Export the stats of `consumers` (durable name → running consumer) of `service` on `registry`."""
    collector = collector_for(registry)
    for name, consumer in consumers.items():
        collector.watch(service=service, name=name, consumer=consumer)


def retire_consumers(registry: CollectorRegistry, *, service: str, names: Iterable[str]) -> None:
    """Call after stopping the consumers: their final counts stay exported and carry into a restart."""
    collector = collector_for(registry)
    for name in names:
        collector.retire(service=service, name=name)


# --- readiness checks: None when ready, else a one-line reason (raising also means "not ready")

ReadinessCheck = Callable[[], Awaitable[str | None]]
"""Returns None when ready, else a one-line reason; raising counts as not ready."""


def database_ready(engine: AsyncEngine) -> ReadinessCheck:
    """Ready when the database answers and is migrated; never again once the engine is disposed (shutdown)."""
    disposed = threading.Event()

    def on_disposed(_engine: Any) -> None:
        disposed.set()

    # dispose() only empties the pool (the next query reconnects), so it has to be observed to be seen.
    sa.event.listen(engine.sync_engine, "engine_disposed", on_disposed)

    async def check() -> str | None:
        if disposed.is_set():
            return "database engine disposed (the process is shutting down)"
        async with engine.connect() as connection:
            migrated = await connection.run_sync(lambda c: sa.inspect(c).has_table("alembic_version"))
        if not migrated:
            return "database is not migrated (no alembic_version table; run the migrations)"
        return None

    return check


def bus_ready(bus: Bus, *, stream: str = streams.KOORD_NODE) -> ReadinessCheck:
    """Ready when the bus answers a stream-info request (a closed or unreachable bus raises)."""

    async def check() -> str | None:
        await bus.stream_info(stream)
        return None

    return check
