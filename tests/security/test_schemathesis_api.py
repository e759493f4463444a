"""Schemathesis over the API's own OpenAPI document (issue #19, point 7): every operation, called with generated
parameters and bodies as each role (viewer, quota-admin, admin), answers without a 5xx and as documented (status
codes, content types, response schemas). Bounded: a few examples per operation, each sent as every role.

The API is the real one over real components, as tests/integration/test_quota_api.py builds it: a nats-server with
koordbus's streams, SQLite migrated to head, the quota service, the event hub and the NodeSLO reader, served by
uvicorn in a thread of its own (schemathesis calls it over HTTP, blocking, from the test's thread). The SSE stream
is left out: it never ends, which is its contract.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

from bus import streams
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from koordbus import runtime
from services.api import auth
from services.api.app import ApiContext, create_app
from services.api.event_hub import EventHub
from services.api.settings import ApiSettings
from services.common import db
from services.common.metrics import new_registry
from services.migration.client import MigrationClient
from services.migration.store import MigrationStore
from services.nodemetric.store import NodeMetricStore
from services.noderesource.store import NodeResourceStore
from services.quota.client import QuotaClient
from services.quota.service import QuotaService
from services.quota.store import QuotaStore
from services.slo.reader import SloReader
from tests.integration.test_quota_cli import free_port
from tests.integration.test_quota_service import SETTINGS, node, observe
from tests.support import api_auth

EXAMPLES = 25
ROLES = (auth.VIEWER, auth.QUOTA_ADMIN, auth.ADMIN)
LEFT_OUT = r"^/api/v1/events/stream$"
NOT_OUR_CONTRACT = [schemathesis.checks.positive_data_acceptance]
"""A request the schema allows may still be refused (a 400/422 naming why): limits set by the server's settings,
quota rules, names and times checked beyond their JSON type. Every other check runs: no 5xx, documented status
codes, content types, headers and response schemas, refusal of schema-invalid data, authentication enforced."""


async def _serve(tmp: Path, port: int, ready: threading.Event, stop: asyncio.Event) -> None:
    url = f"sqlite:///{tmp / 'koordbus.db'}"
    await db.run_migrations(url)
    engine = db.create_engine(url)
    server = EmbeddedNatsServer(store_dir=tmp / "nats")
    await server.start()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(server.stop)
        stack.push_async_callback(engine.dispose)
        bus = await JetStreamBus.connect(server.url, name="schemathesis")
        stack.push_async_callback(bus.close)
        await bus.ensure_streams(streams.all_streams())
        quota_store = QuotaStore(engine)
        service = QuotaService(bus, SETTINGS, registry=new_registry(), store=quota_store)
        await service.start()
        stack.push_async_callback(service.stop)
        await observe(bus, node("n1", "40", "40Gi"))
        hub = EventHub(bus)
        stack.push_async_callback(hub.close)
        context = ApiContext(
            settings=ApiSettings(),
            registry=new_registry(),
            tokens=api_auth.token_store(),
            nodemetric_store=NodeMetricStore(engine),
            noderesource_store=NodeResourceStore(engine),
            quota_store=quota_store,
            quota_client=QuotaClient(bus, timeout=5),
            migration_store=MigrationStore(engine),
            migration_client=MigrationClient(bus),
            slo_reader=SloReader(bus),
            event_hub=hub,
            recorded_writes=lambda: {"items": []},
        )
        await runtime.serve_http(stack, create_app(context), host="127.0.0.1", port=port)
        ready.set()
        await stop.wait()


@pytest.fixture(scope="module")
def live_api(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API's base URL, served from its own thread and event loop until the module's tests are done."""
    tmp = tmp_path_factory.mktemp("schemathesis")
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


@pytest.fixture(scope="module")
def api_schema(live_api: str) -> Any:
    document = httpx.get(f"{live_api}/openapi.json", timeout=10).json()
    schema = schemathesis.openapi.from_dict(document).exclude(path_regex=LEFT_OUT)
    schema.config.update(base_url=live_api)
    return schema


def test_every_operation_answers_as_documented_without_a_5xx(api_schema: Any) -> None:
    failures: list[str] = []
    for result in api_schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
            phases=[Phase.explicit, Phase.generate],
        )
        def exercise(case: Any) -> None:
            for role in ROLES:  # the same request as each role: refused or answered, always as documented
                case.call_and_validate(headers=api_auth.headers(role), timeout=20, excluded_checks=NOT_OUR_CONTRACT)

        try:
            exercise()
        except (Exception, BaseExceptionGroup) as e:  # schemathesis' FailureGroup is a BaseExceptionGroup
            failures.append(f"{operation.label}: {e}")
    assert not failures, "\n\n".join(failures)
