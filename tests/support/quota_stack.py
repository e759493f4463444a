"""A running quota stack for API and CLI tests: a private nats-server with koordbus's streams, the quota service
with its projections on the given engine, one Node of 40 cores / 40Gi observed, and the API app wired to both (with
the ClusterColocationProfile routes over the same bus)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from fastapi import FastAPI
from sqlalchemy.ext.asyncio import AsyncEngine

from bus import streams
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from services.api.app import ApiContext, create_app
from services.api.settings import ApiSettings
from services.common.metrics import new_registry
from services.migration import component as migration_component
from services.quota import component as quota_component
from services.quota.client import QuotaClient
from services.quota.service import QuotaService
from services.quota.store import QuotaStore
from services.webhook import component as webhook_component
from tests.integration.test_quota_service import SETTINGS, node, observe
from tests.support import api_auth


@dataclass
class QuotaStack:
    app: FastAPI
    bus: JetStreamBus
    service: QuotaService
    nats_url: str


@contextlib.asynccontextmanager
async def quota_stack(tmp_path: Path, engine: AsyncEngine) -> AsyncIterator[QuotaStack]:
    server = EmbeddedNatsServer(store_dir=tmp_path / "nats")
    await server.start()
    bus = await JetStreamBus.connect(server.url, name="quota-stack")
    service: QuotaService | None = None
    try:
        await bus.ensure_streams(streams.all_streams())
        store = QuotaStore(engine)
        service = QuotaService(bus, SETTINGS, registry=new_registry(), store=store)
        await service.start()
        await observe(bus, node("n1", "40", "40Gi"))
        context = ApiContext(
            settings=ApiSettings(),
            registry=new_registry(),
            tokens=api_auth.token_store(),
            # the migration routes with nothing behind them: their bodies are checked before anything is asked
            components=(
                quota_component.routes_over(store, QuotaClient(bus)),
                migration_component.routes_over(None, None),
                webhook_component.profiles(bus),
            ),
        )
        yield QuotaStack(app=create_app(context), bus=bus, service=service, nats_url=server.url)
    finally:
        if service is not None:
            await service.stop()
        await bus.close()
        await server.stop()
