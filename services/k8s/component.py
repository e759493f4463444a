"""The Kubernetes bridge's REST route (services.k8s.routes: what record-only mode would have written) as the
composition root assembles it (koordbus.up, koordbus.service)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from services.common.component import Component
from services.k8s import routes


def recorded_writes(export: Callable[[], Any] | None) -> Component:
    """The route over the recording sink's `export`; None (a process writing to a real cluster): it answers 404."""
    provides = (routes.RecordedWrites(export),) if export is not None else ()
    return Component(name="k8s", routers=(routes.router,), provides=provides)
