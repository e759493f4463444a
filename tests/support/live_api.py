"""The whole REST API served over HTTP from a thread of its own, for tests that call it blocking (schemathesis,
hypothesis): a nats-server with koordbus's streams, SQLite migrated to head, the quota service with its projections,
the event hub, the NodeSLO reader and the migration, nodemetric and noderesource stores, as `koordbus up` wires them,
plus the load-aware extender, which answers the scheduler state export, and the migration service, which answers the
descheduler's plan, and the ClusterColocationProfile routes over the profile log
(tests/security/test_schemathesis_api.py, test_bodies_fuzz_api.py)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

from bus import streams
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from koordbus import http_serve
from koordbus.common import watermark_defaults
from services.api.app import ApiContext, create_app
from services.api.event_hub import EventHub
from services.api.settings import ApiSettings
from services.common import db
from services.common.component import Component
from services.common.metrics import new_registry
from services.common.watermark_feed import WatermarkReader
from services.k8s import component as k8s_component
from services.loadaware import component as loadaware_component
from services.loadaware.client import LoadAwareClient
from services.loadaware.service import LoadAwareService
from services.loadaware.settings import LoadAwareSettings
from services.migration import component as migration_component
from services.migration.client import MigrationClient
from services.migration.service import MigrationService
from services.migration.settings import MigrationSettings
from services.migration.store import MigrationStore
from services.nodemetric import component as nodemetric_component
from services.nodemetric.service import NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore
from services.noderesource import component as noderesource_component
from services.noderesource.store import NodeResourceStore
from services.quota import component as quota_component
from services.quota.client import QuotaClient
from services.quota.service import QuotaService
from services.quota.store import QuotaStore
from services.slo import component as slo_component
from services.webhook import component as webhook_component
from tests.integration.test_quota_service import SETTINGS, node, observe
from tests.support import api_auth


async def _serve(tmp: Path, port: int, ready: threading.Event, stop: asyncio.Event) -> None:
    url = f"sqlite:///{tmp / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    server = EmbeddedNatsServer(store_dir=tmp / "nats")
    await server.start()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(server.stop)
        stack.push_async_callback(engine.dispose)
        bus = await JetStreamBus.connect(server.url, name="live-api")
        stack.push_async_callback(bus.close)
        await bus.ensure_streams(streams.all_streams())
        quota_store = QuotaStore(engine)
        service = QuotaService(bus, SETTINGS, registry=new_registry(), store=quota_store)
        await service.start()
        stack.push_async_callback(service.stop)
        await observe(bus, node("n1", "40", "40Gi"))
        extender = LoadAwareService(bus, LoadAwareSettings(startup_timeout_seconds=5), registry=new_registry())
        await extender.start()  # answers the scheduler state export
        stack.push_async_callback(extender.stop)
        nodemetric_store = NodeMetricStore(engine)
        nodemetric = NodeMetricService(bus, nodemetric_store, NodeMetricSettings(), registry=new_registry())
        await nodemetric.start()  # answers the prediction route (404: no node has sent a training round)
        stack.push_async_callback(nodemetric.stop)
        migration_store = MigrationStore(engine)
        arbiter = MigrationService(
            bus, MigrationSettings(startup_timeout_seconds=10), registry=new_registry(), store=migration_store
        )
        await arbiter.start()  # answers the descheduler's plan (200, "no lowNodeLoadArgs": nothing configured)
        stack.push_async_callback(arbiter.stop)
        hub = EventHub(bus)
        stack.push_async_callback(hub.close)
        context = ApiContext(
            settings=ApiSettings(),
            registry=new_registry(),
            tokens=api_auth.token_store(),
            components=(
                nodemetric_component.reads(nodemetric_store, bus=bus),
                noderesource_component.reads(NodeResourceStore(engine)),
                quota_component.routes_over(quota_store, QuotaClient(bus, timeout=5)),
                migration_component.routes_over(migration_store, MigrationClient(bus)),
                k8s_component.recorded_writes(lambda: {"items": []}),
                loadaware_component.queries(LoadAwareClient(bus, timeout=5)),
                slo_component.reads(bus),
                webhook_component.profiles(bus),
            ),
            watermark_reader=WatermarkReader(bus),
            watermark_defaults=watermark_defaults(),
            event_hub=hub,
        )
        await http_serve.serve_http(
            stack, create_app(context), host="127.0.0.1", port=port, end_streams=hub.end_streams
        )
        ready.set()
        await stop.wait()


@contextlib.contextmanager
def live_api(tmp: Path) -> Iterator[str]:
    """The API's base URL, served from its own thread and event loop until the block ends."""
    port = free_port()
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    failure: list[BaseException] = []

    def run() -> None:
        try:
            loop.run_until_complete(_serve(tmp, port, ready, stop))
        except BaseException as e:  # reported by the fixture below, not lost in the thread
            failure.append(e)
            ready.set()
        finally:
            loop.close()

    thread = threading.Thread(target=run, name="live-api", daemon=True)
    thread.start()
    assert ready.wait(60), "the API did not come up within 60 s"
    if failure:
        raise failure[0]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def routes_only() -> tuple[Component, ...]:
    """Every component's routes with nothing behind them (they answer 503): the API's OpenAPI document as the live
    API above serves it."""
    return (
        nodemetric_component.reads(None),
        noderesource_component.reads(None),
        quota_component.routes_over(None, None),
        migration_component.routes_over(None, None),
        k8s_component.recorded_writes(lambda: {"items": []}),
        loadaware_component.queries(None),
        slo_component.reads(None),
        webhook_component.profiles(None),
    )


async def serve_events_api(stack: contextlib.AsyncExitStack, bus: JetStreamBus) -> str:
    """The API with only the event hub and the NodeSLO reader, served on the caller's loop until `stack` closes (small
    hub caps so capacity is reachable); returns its base URL. Used by tests/security/test_names_api.py and
    test_bodies_events.py."""
    await bus.ensure_streams(streams.all_streams())
    hub = EventHub(bus, max_subscriptions=4, max_per_caller=3, queue_size=50)
    context = ApiContext(
        settings=ApiSettings(),
        registry=new_registry(),
        tokens=api_auth.token_store(),
        event_hub=hub,
        components=(slo_component.reads(bus),),
        watermark_reader=WatermarkReader(bus),
        watermark_defaults=watermark_defaults(),
    )
    stack.push_async_callback(hub.close)
    port = free_port()
    await http_serve.serve_http(stack, create_app(context), host="127.0.0.1", port=port, end_streams=hub.end_streams)
    return f"http://127.0.0.1:{port}"
