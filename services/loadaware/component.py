"""The load-aware extender's API route (services.loadaware.routes: a node's extender state, asked over the bus) as the
composition root assembles it (koordbus.up, koordbus.api). The extender itself runs as `koordbus service loadaware`,
or inside `koordbus up` (koordbus.extender), with its own HTTP app (services.loadaware.http)."""

from __future__ import annotations

from schemas.qos import WatermarksInEffect
from services.common.component import Component
from services.common.watermarks import WatermarkConfig
from services.loadaware import args, routes
from services.loadaware.client import LoadAwareClient


def watermark_defaults(config: WatermarkConfig) -> WatermarksInEffect:
    """What the extender would state from the config alone with Koordinator's default args (the watermarks view of a
    process without a running extender)."""
    return args.stated_watermarks(args.apply_watermarks(args.DEFAULT_ARGS, config.watermarks), config, at=0.0)


def queries(client: LoadAwareClient | None) -> Component:
    """The route asking the extender through `client`; None: it answers 503."""
    provides = (routes.SchedulerQueries(client),) if client is not None else ()
    return Component(name="loadaware", routers=(routes.router,), provides=provides)
