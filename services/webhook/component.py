"""The webhook package's REST routes (services.webhook.routes: the ClusterColocationProfiles koordbus holds) as the
composition root assembles them (koordbus.up, koordbus.api); the admission routes themselves are served by the
webhook process (koordbus.webhook)."""

from __future__ import annotations

from bus.api import Bus
from services.common.component import Component
from services.webhook import routes
from services.webhook.client import ProfileClient


def profiles(bus: Bus | None) -> Component:
    """The profile routes over the profile log on `bus`; None: they answer 503."""
    provides = (routes.ProfileAccess(ProfileClient(bus)),) if bus is not None else ()
    return Component(name="colocation-profiles", routers=(routes.router,), provides=provides)
