"""The noderesource service as the composition root assembles it (koordbus.up, koordbus.service, koordbus.api): the
service on the bus with its projections, and its REST routes (services.noderesource.routes) with what they read."""

from __future__ import annotations

from contextlib import AsyncExitStack

from sqlalchemy.ext.asyncio import AsyncEngine

from bus.api import Bus
from services.common.component import Component
from services.common.metrics import CollectorRegistry
from services.noderesource import routes
from services.noderesource.service import NodeResourceService
from services.noderesource.settings import NodeResourceSettings
from services.noderesource.store import NodeResourceStore


def reads(store: NodeResourceStore | None) -> Component:
    """The routes over projections another process writes (`koordbus api`); without a store they answer 503."""
    if store is None:
        return Component(name="noderesource", routers=(routes.router,))
    reads = routes.NodeResourceReads(store=store)
    return Component(name="noderesource", routers=(routes.router,), provides=(reads, routes.overview_resources(reads)))


async def build(
    stack: AsyncExitStack, *, bus: Bus, engine: AsyncEngine, registry: CollectorRegistry, settings: NodeResourceSettings
) -> Component:
    """Start the service (stopped when the stack closes) and its routes."""
    store = NodeResourceStore(engine, history_limit=settings.history_limit)
    service = NodeResourceService(bus, settings, registry=registry, store=store)
    await service.start()
    stack.push_async_callback(service.stop)
    return reads(store)
