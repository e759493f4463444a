"""The migration service's REST routes (services.migration.routes) as the composition root assembles them
(koordbus.up, koordbus.service, koordbus.api), with what they read and whom they ask."""

from __future__ import annotations

from schemas.qos import WatermarksInEffect
from services.common.component import Component
from services.common.watermarks import WatermarkConfig
from services.migration import lownodeload, routes
from services.migration.client import MigrationClient
from services.migration.store import MigrationStore


def watermark_defaults(config: WatermarkConfig) -> WatermarksInEffect:
    """What the descheduler would state from the config alone with its default args (the watermarks view of a process
    without a running descheduler)."""
    return lownodeload.stated_watermarks(
        lownodeload.apply_watermarks(lownodeload.LowNodeLoadArgs(), config.watermarks), config, at=0.0
    )


def routes_over(store: MigrationStore | None, client: MigrationClient | None) -> Component:
    """The routes: jobs and trails read from `store`, requests and aborts published through `client` (either None:
    those routes answer 503)."""
    provides: list[object] = []
    if store is not None:
        provides.append(routes.MigrationReads(store))
    if client is not None:
        provides.append(routes.MigrationRequests(client))
    return Component(name="migration", routers=(routes.router,), provides=provides, body_types=routes.BODY_TYPES)
