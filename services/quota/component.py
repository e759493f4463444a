"""The quota service as the composition root assembles it (koordbus.up, koordbus.service, koordbus.api): the service
on the bus with its projections, and its REST routes (services.quota.routes) with what they read and whom they ask."""

from __future__ import annotations

from contextlib import AsyncExitStack

from sqlalchemy.ext.asyncio import AsyncEngine

from bus.api import Bus
from services.common.component import Component
from services.common.metrics import CollectorRegistry
from services.quota import routes
from services.quota.client import QuotaClient
from services.quota.service import QuotaService
from services.quota.settings import QuotaSettings
from services.quota.store import QuotaStore


def routes_over(store: QuotaStore | None, client: QuotaClient | None) -> Component:
    """The routes: reads from `store`, writes, checks and what-ifs asked of the quota service through `client`
    (either None: those routes answer 503)."""
    provides: list[object] = []
    if store is not None:
        provides.append(routes.QuotaReads(store))
    if client is not None:
        provides.append(routes.QuotaRequests(client))
    return Component(name="quota", routers=(routes.router,), provides=provides, body_types=routes.BODY_TYPES)


async def build(
    stack: AsyncExitStack, *, bus: Bus, engine: AsyncEngine, registry: CollectorRegistry, settings: QuotaSettings
) -> Component:
    """Start the service with its projections (stopped when the stack closes) and its routes."""
    store = QuotaStore(engine)
    service = QuotaService(bus, settings, registry=registry, store=store)
    await service.start()
    stack.push_async_callback(service.stop)
    return routes_over(store, QuotaClient(bus, registry=registry))
