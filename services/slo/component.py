"""The slo service's REST routes (services.slo.routes: NodeSLOs and actuations, read from the bus) as the composition
root assembles them (koordbus.up, koordbus.service, koordbus.api)."""

from __future__ import annotations

from bus.api import Bus
from services.common.component import Component
from services.slo import routes
from services.slo.reader import SloReader


def reads(bus: Bus | None) -> Component:
    """The routes reading node QoS from `bus`; None: they answer 503."""
    provides = (routes.SloReads(SloReader(bus)),) if bus is not None else ()
    return Component(name="slo", routers=(routes.router,), provides=provides)
