"""What a consumer loop observes, on a real nats-server: lag, delivery-to-ack and event-age histograms, dead letters
(as exported by services.common.observe), and the handled event's fields on log lines (JSON format)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from bus import event_context, streams, subjects
from bus.api import ConsumerSpec, Delivery
from bus.errors import PermanentError
from bus.jetstream import JetStreamBus
from koordbus.logs import JsonFormatter
from services.common import observe
from services.common.metrics import new_registry, render
from tests.bus import Names
from tests.support.waiting import eventually

SERVICE = "observed"


@pytest.fixture
def names() -> Names:
    return Names()


def samples(registry: CollectorRegistry, name: str, **labels: str) -> dict[str, float]:
    """Sample name (+ le for buckets) → value of the rendered family `name` with these labels."""
    found: dict[str, float] = {}
    for family in text_string_to_metric_families(render(registry).decode()):
        if family.name != name:
            continue
        for sample in family.samples:
            if all(sample.labels.get(k) == v for k, v in labels.items()):
                le = sample.labels.get("le")
                found[sample.name + (f"{{le={le}}}" if le else "")] = sample.value
    return found


class _Held:
    """Holds the first message until released, dead-letters payloads starting with b"poison", records the rest."""

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.holding = asyncio.Event()
        self.handled: list[Delivery] = []

    async def handle(self, delivery: Delivery) -> None:
        if not self.handled and not self.release.is_set():
            self.holding.set()
            await self.release.wait()
        if delivery.data.startswith(b"poison"):
            raise PermanentError("poison payload")
        self.handled.append(delivery)

    async def flush(self) -> None:
        return None


async def test_lag_histograms_and_dead_letters_of_a_consumer_move_with_real_events(
    jetstream_bus: JetStreamBus, names: Names
) -> None:
    bus = jetstream_bus
    await bus.ensure_streams([names.stream_spec(), names.dlq_spec()])
    for k in range(5):
        await bus.publish(names.subject("a"), f"m{k}".encode(), msg_id=f"m{k}")
    await bus.publish(names.subject("a"), b"poison", msg_id="poison")
    await asyncio.sleep(0.3)  # every event is at least this old when handled
    registry = new_registry()
    handler = _Held()
    consumer = bus.consume(names.consumer("c", batch_size=2), handler)
    observe.watch_consumers(registry, service=SERVICE, consumers={"c": consumer})
    labels = {"consumer": "c", "service": SERVICE}
    try:
        await asyncio.wait_for(handler.holding.wait(), 10)
        # the first of six messages is in hand: five more are still to come
        assert samples(registry, "koordbus_consumer_pending_messages", **labels) == {
            "koordbus_consumer_pending_messages": 5.0
        }
        await asyncio.sleep(0.3)  # the held batch takes at least this long from delivery to ack
        handler.release.set()
        await eventually(lambda: consumer.stats.acked == 5 and consumer.stats.dead_lettered == 1)
        lag = samples(registry, "koordbus_consumer_pending_messages", **labels)
        assert lag == {"koordbus_consumer_pending_messages": 0.0}
        handled = samples(registry, "koordbus_consumer_handle_seconds", **labels)
        assert handled["koordbus_consumer_handle_seconds_count"] == 5  # acks only: the poison one was dead-lettered
        assert handled["koordbus_consumer_handle_seconds_bucket{le=+Inf}"] == 5
        # the two messages of the held batch waited ≥ 0.3 s for their ack
        assert handled["koordbus_consumer_handle_seconds_bucket{le=0.25}"] <= 3
        assert handled["koordbus_consumer_handle_seconds_sum"] >= 0.6
        ages = samples(registry, "koordbus_consumer_event_age_seconds", **labels)
        assert ages["koordbus_consumer_event_age_seconds_count"] == 6  # every handler call, the poison one too
        assert ages["koordbus_consumer_event_age_seconds_bucket{le=0.25}"] == 0
        dead = samples(registry, "koordbus_consumer_dead_lettered", **labels)
        assert dead == {"koordbus_consumer_dead_lettered_total": 1.0}
    finally:
        await consumer.stop()
    # a restarted consumer of the same name adds to the histograms instead of starting them again
    observe.retire_consumers(registry, service=SERVICE, names=("c",))
    again = bus.consume(names.consumer("c", batch_size=2), handler)
    observe.watch_consumers(registry, service=SERVICE, consumers={"c": again})
    try:
        await bus.publish(names.subject("a"), b"late", msg_id="late")
        await eventually(lambda: again.stats.acked == 1)
        handled = samples(registry, "koordbus_consumer_handle_seconds", **labels)
        assert handled["koordbus_consumer_handle_seconds_count"] == 6
    finally:
        await again.stop()


@pytest.fixture
def json_log() -> Iterator[io.StringIO]:
    """JSON lines of the `koordbus.test.events` logger, through the filter configure_logging installs."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    handler.addFilter(event_context.EventContextFilter())
    logger = logging.getLogger("koordbus.test.events")
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield out
    finally:
        logger.removeHandler(handler)
        handler.close()


class _Logging:
    def __init__(self) -> None:
        self.log = logging.getLogger("koordbus.test.events")
        self.count = 0

    async def handle(self, delivery: Delivery) -> None:
        self.log.info("handling %d bytes", len(delivery.data))
        self.count += 1

    async def flush(self) -> None:
        self.log.info("flushing")


async def test_a_line_logged_while_handling_an_event_carries_its_id_and_node(
    koordbus_bus: JetStreamBus, json_log: io.StringIO
) -> None:
    node = "worker-7.example.com"
    await koordbus_bus.publish(subjects.node_state(node), b"{}", msg_id="event-42")
    handler = _Logging()
    spec = ConsumerSpec(
        durable="test-log-context",
        stream=streams.KOORD_NODE,
        filter_subjects=(subjects.NODE_STATE_ALL,),
        service="test-log-context",
        fetch_timeout_seconds=0.2,
    )
    consumer = koordbus_bus.consume(spec, handler)
    try:
        await eventually(lambda: consumer.stats.acked == 1)
    finally:
        await consumer.stop()
    logging.getLogger("koordbus.test.events").info("after handling")
    lines = [json.loads(line) for line in json_log.getvalue().splitlines()]
    handling = [line for line in lines if line["message"] == "handling 2 bytes"]
    assert len(handling) == 1
    assert handling[0] | {"time": "?"} == {
        "time": "?",
        "level": "INFO",
        "logger": "koordbus.test.events",
        "message": "handling 2 bytes",
        "event_id": "event-42",
        "subject": f"{subjects.node_state(node)}.{subjects.node_partition(node)}",  # as KOORD_NODE stores it
        "stream_seq": 1,
        "consumer": "test-log-context",
        "node": node,
    }
    outside = [line for line in lines if line["message"] in ("after handling", "flushing")]
    assert outside, "the flush and the line after handling were logged"
    for line in outside:
        assert set(line) == {"time", "level", "logger", "message"}
