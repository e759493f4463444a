"""The nodemetric service as the composition root assembles it (koordbus.up, koordbus.service, koordbus.api): the
service on the bus with its projections, and its REST routes (services.nodemetric.routes) with what they read."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack

from sqlalchemy.ext.asyncio import AsyncEngine

from bus.api import Bus
from services.common.component import Component, RouteSettings
from services.common.metrics import CollectorRegistry
from services.nodemetric import routes
from services.nodemetric.client import PredictionClient
from services.nodemetric.service import NodeMetricService
from services.nodemetric.settings import NodeMetricSettings
from services.nodemetric.store import NodeMetricStore


def reads(
    store: NodeMetricStore | None, route_settings: RouteSettings | None = None, *, bus: Bus | None = None
) -> Component:
    """The routes over projections another process writes (`koordbus api`, the noderesource service's port), and
    the prediction route asking the replicas over `bus`; without a store (a bus) those answer 503."""
    queries = () if bus is None else (routes.PredictionQueries(PredictionClient(bus)),)
    if store is None:
        return Component(name="nodemetric", routers=(routes.router,), provides=queries)
    return _component(routes.NodeMetricReads(store=store, settings=route_settings or RouteSettings()), queries)


def _component(
    reads: routes.NodeMetricReads,
    queries: tuple[routes.PredictionQueries, ...],
    *,
    before_metrics: tuple[Callable[[], None], ...] = (),
) -> Component:
    """The routes over `reads`, which the dashboard's overview reads too."""
    return Component(
        name="nodemetric",
        routers=(routes.router,),
        provides=(reads, routes.overview_nodes(reads), *queries),
        before_metrics=before_metrics,
    )


async def build(
    stack: AsyncExitStack,
    *,
    bus: Bus,
    engine: AsyncEngine,
    registry: CollectorRegistry,
    settings: NodeMetricSettings,
    route_settings: RouteSettings,
) -> Component:
    """Start the service (stopped when the stack closes); its routes, and its gauges refreshed before each scrape."""
    store = NodeMetricStore(engine)
    service = NodeMetricService(bus, store, settings, registry=registry)
    await service.start()
    stack.push_async_callback(service.stop)
    reads = routes.NodeMetricReads(store=store, settings=route_settings)
    queries = (routes.PredictionQueries(PredictionClient(bus)),)
    return _component(reads, queries, before_metrics=(service.refresh_gauges,))
