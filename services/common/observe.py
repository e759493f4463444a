"""Observability shared by services: bus consumer statistics as Prometheus metrics, and readiness checks.

Every service calls `watch_consumers(registry, service=…, consumers=…)` when it starts its consumer
loops and `retire_consumers(…)` when it stops them; the API's `/metrics` renders the registry. One
`ConsumerStatsCollector` serves a registry, so every service in a process (or one service started twice) shares
the same metric families instead of colliding on "Duplicated timeseries". Per consumer it exports the counters
(`koordbus_consumer_<field>_total`), two histograms (`koordbus_consumer_handle_seconds`: delivery to ack;
`koordbus_consumer_event_age_seconds`: now − publish time at handling) and the lag gauge
(`koordbus_consumer_pending_messages`), labelled by consumer (durable) and service — names fixed in code, never a
node or pod. Counters and histograms stay monotonic across a restart: a retired consumer's final counts are carried
into the next consumer of the same name; the lag is exported for running consumers only.
`watch_bus` exports the bus's own publish retries (`koordbus_bus_publish_retries_total`, by failure).
`database_ready` and `bus_ready` build the checks the composition root hands to the API's `/readyz`.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any, Final

import sqlalchemy as sa
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import retry, streams
from bus.api import Bus, Consumer, ConsumerSpec, ConsumerStats, Distribution
from services.common.metrics import once_per_registry

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
    "acks_resent": "Acks sent again because the server did not confirm them (on a NATS cluster: the consumer's "
    "leader changed and took them along; without the resend the messages would come back after ack_wait)",
    "deliveries_lost": "Deliveries lost in flight on a consumer read in stream order (a server or connection lost "
    "with a pull's messages on their way); the consumer was restarted after the last message handed out",
}
"""ConsumerStats field → help text; each becomes `koordbus_consumer_<field>_total`."""
HISTOGRAMS: Final[Mapping[str, str]] = {
    "handle_seconds": "Seconds from a message's delivery to the consumer (its batch fetched) until its ack: "
    "handling, the batch's flush (a database transaction, a Kubernetes write queue) and the ack",
    "event_age_seconds": "Age of a message when its handler is called: now minus the time the stream stored it "
    "(large during a replay or after a backlog; redeliveries included)",
}
"""ConsumerStats Distribution field → help text; each becomes the histogram `koordbus_consumer_<field>`."""
PENDING_METRIC: Final = METRIC_PREFIX + "pending_messages"
PENDING_HELP: Final = (
    "Consumer lag: messages in the stream after the last one delivered that the consumer has yet to receive "
    "(the server's count sent with each message)"
)

ConsumerKey = tuple[str, str]
"""(service, consumer name)."""


def counts_of(stats: ConsumerStats) -> dict[str, int]:
    """The counter fields of one consumer's stats."""
    return {name: int(getattr(stats, name)) for name in COUNTERS}


def add_counts(a: Mapping[str, int], b: Mapping[str, int]) -> dict[str, int]:
    return {name: a.get(name, 0) + b.get(name, 0) for name in COUNTERS}


def distributions_of(stats: ConsumerStats) -> dict[str, Distribution]:
    return {name: getattr(stats, name) for name in HISTOGRAMS}


def add_distributions(a: Mapping[str, Distribution], b: Mapping[str, Distribution]) -> dict[str, Distribution]:
    """Both sides' observations per name, as new objects (a live consumer keeps changing its own)."""
    merged = dict(a)
    for name, distribution in b.items():
        merged[name] = merged.get(name, Distribution(bounds=distribution.bounds)).plus(distribution)
    return merged


def histogram_buckets(distribution: Distribution) -> list[tuple[str, float]]:
    """Cumulative (le, count) pairs ending with +Inf, as HistogramMetricFamily takes them."""
    buckets: list[tuple[str, float]] = []
    running = 0
    for bound, count in zip((*distribution.bounds, float("inf")), distribution.counts, strict=True):
        running += count
        buckets.append(("+Inf" if bound == float("inf") else repr(float(bound)), running))
    return buckets


class ConsumerStatsCollector:
    """A custom Prometheus collector over the consumers it watches; create it with `collector_for`."""

    def __init__(self) -> None:
        self._live: dict[ConsumerKey, Consumer] = {}
        self._carried: dict[ConsumerKey, dict[str, int]] = {}
        self._carried_distributions: dict[ConsumerKey, dict[str, Distribution]] = {}
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

    def distributions(self) -> dict[ConsumerKey, dict[str, Distribution]]:
        """Histogram data per (service, consumer): carried-over observations plus the live consumer's."""
        with self._lock:
            keys = sorted(set(self._live) | set(self._carried_distributions))
            return {
                key: add_distributions(
                    self._carried_distributions.get(key, {}),
                    distributions_of(self._live[key].stats) if key in self._live else {},
                )
                for key in keys
            }

    def pending(self) -> dict[ConsumerKey, int]:
        """The lag of each running consumer."""
        with self._lock:
            return {key: consumer.stats.pending for key, consumer in sorted(self._live.items())}

    def describe(self) -> list[Metric]:
        # Declares the family names so the registry rejects a second collector exporting them.
        return [*_counter_families().values(), *_histogram_families().values(), _pending_family()]

    def collect(self) -> Iterator[Metric]:
        counters = _counter_families()
        for (service, consumer), counts in self.totals().items():
            for name, family in counters.items():
                family.add_metric([consumer, service], counts[name])
        histograms = _histogram_families()
        for (service, consumer), distributions in self.distributions().items():
            for name, distribution in distributions.items():
                histograms[name].add_metric([consumer, service], histogram_buckets(distribution), distribution.total)
        lag = _pending_family()
        for (service, consumer), pending in self.pending().items():
            lag.add_metric([consumer, service], pending)
        yield from counters.values()
        yield from histograms.values()
        yield lag

    def _carry(self, key: ConsumerKey, consumer: Consumer) -> None:
        self._carried[key] = add_counts(self._carried.get(key, {}), counts_of(consumer.stats))
        self._carried_distributions[key] = add_distributions(
            self._carried_distributions.get(key, {}), distributions_of(consumer.stats)
        )


def _counter_families() -> dict[str, CounterMetricFamily]:
    return {
        name: CounterMetricFamily(METRIC_PREFIX + name, help_text, labels=LABELS)
        for name, help_text in COUNTERS.items()
    }


def _histogram_families() -> dict[str, HistogramMetricFamily]:
    return {
        name: HistogramMetricFamily(METRIC_PREFIX + name, help_text, labels=LABELS)
        for name, help_text in HISTOGRAMS.items()
    }


def _pending_family() -> GaugeMetricFamily:
    return GaugeMetricFamily(PENDING_METRIC, PENDING_HELP, labels=LABELS)


def collector_for(registry: CollectorRegistry) -> ConsumerStatsCollector:
    """The registry's consumer collector, registered on first use."""

    def create(registry: CollectorRegistry) -> ConsumerStatsCollector:
        collector = ConsumerStatsCollector()
        registry.register(collector)
        return collector

    return once_per_registry(registry, "consumer-stats", create)


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


def watch_consumer(registry: CollectorRegistry, spec: ConsumerSpec, consumer: Consumer) -> Consumer:
    """Export one consumer's stats under its spec's durable name and service (the dead-letter subject's); returns
    the consumer, so `watch_consumer(registry, spec, bus.consume(spec, handler))` reads as one step."""
    collector_for(registry).watch(service=spec.service, name=spec.durable, consumer=consumer)
    return consumer


def retire_consumer(registry: CollectorRegistry, spec: ConsumerSpec) -> None:
    """`retire_consumers` for the consumer `watch_consumer` exported under `spec`."""
    collector_for(registry).retire(service=spec.service, name=spec.durable)


# --- the bus's own retries

PUBLISH_RETRIES_METRIC: Final = "koordbus_bus_publish_retries"
PUBLISH_RETRIES_HELP: Final = (
    "Publishes the bus sent again because a NATS cluster could not take them then (bus.retry), by what it answered: "
    "no responders or temporarily unavailable (a stream leader being elected), no answer (retried with its msg id)"
)


class PublishRetriesCollector:
    """Exports the `publish_retries` counts (bus.jetstream.JetStreamBus) of a process's buses, summed, as one counter
    labelled by failure."""

    def __init__(self) -> None:
        self._counts: list[Mapping[str, int]] = []

    def add(self, counts: Mapping[str, int]) -> None:
        if not any(held is counts for held in self._counts):
            self._counts.append(counts)

    def describe(self) -> list[Metric]:
        return [CounterMetricFamily(PUBLISH_RETRIES_METRIC, PUBLISH_RETRIES_HELP, labels=("failure",))]

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(PUBLISH_RETRIES_METRIC, PUBLISH_RETRIES_HELP, labels=("failure",))
        for failure in retry.Failure:
            family.add_metric([failure.value], sum(counts.get(failure.value, 0) for counts in self._counts))
        yield family


def watch_bus(registry: CollectorRegistry, bus: Bus) -> None:
    """Export `bus`'s publish retries on `registry`, added to those of the process's other buses (each bus counted
    once however often it is watched; a bus that keeps none adds nothing)."""
    counts = getattr(bus, "publish_retries", None)
    if counts is None:
        return

    def create(registry: CollectorRegistry) -> PublishRetriesCollector:
        collector = PublishRetriesCollector()
        registry.register(collector)
        return collector

    once_per_registry(registry, "bus-publish-retries", create).add(counts)


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
