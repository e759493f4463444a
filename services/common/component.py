"""What a service hands the composition root besides its running parts: REST routers, what their routes read,
readiness checks and metric refreshers.

Each service's `component.py` builds one `Component` (`build(…)`); the composition root (koordbus.up, koordbus.api,
koordbus.service) passes them to the API app (services.api.app.create_app), which mounts the routers under its
authentication, runs the readiness checks on /readyz and the refreshers before each /metrics render. A service's
routes reach what they read with `provided(request, Kind)`: the object the component registered under its own type,
or None when the process runs without it (the routes then answer 503 naming what is missing), so a route never
reaches into another service's objects or an untyped context.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from fastapi import APIRouter, HTTPException, Request

from services.common.observe import ReadinessCheck

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class RouteSettings:
    """What every service's read routes share, from the API's settings (services.api.settings.ApiSettings)."""

    page_limit_max: int = 1000
    """Largest page a list route returns."""
    stale_after_seconds: float = 180.0
    """A node whose newest sample is older than this is reported stale."""
    clock: Callable[[], float] = field(default=time.time)
    """Wall clock for staleness; tests inject a fixed one."""


@dataclass(frozen=True, kw_only=True)
class Component:
    """One service's contribution to the API process."""

    name: str
    routers: Sequence[APIRouter] = ()
    """Mounted under the API's authentication (every route needs role viewer or higher)."""
    provides: Sequence[object] = ()
    """What the routes read (one object per type): `provided(request, type(obj))` returns it."""
    readiness: Sequence[tuple[str, ReadinessCheck]] = ()
    """(dependency name, check) pairs for /readyz."""
    before_metrics: Sequence[Callable[[], None]] = ()
    """Gauge refreshers run before each /metrics render."""
    body_types: Sequence[type] = ()
    """msgspec types of the bodies the routes read themselves: declared in the OpenAPI document."""


@dataclass(frozen=True)
class Provided:
    """The objects every component provides, by type (the API app keeps one as `app.state.provided`)."""

    by_type: Mapping[type, object] = field(default_factory=dict)

    @classmethod
    def of(cls, components: Sequence[Component]) -> Provided:
        by_type: dict[type, object] = {}
        for component in components:
            for obj in component.provides:
                if type(obj) in by_type:
                    raise ValueError(f"two components provide a {type(obj).__name__} ({component.name} is the second)")
                by_type[type(obj)] = obj
        return cls(by_type)


def provided(request: Request, kind: type[T]) -> T | None:
    """What a component provides as `kind` to this app, or None when the process runs without it."""
    found = getattr(request.app.state, "provided", Provided()).by_type.get(kind)
    return found if isinstance(found, kind) else None


def required(request: Request, kind: type[T], *, missing: str) -> T:
    """`provided`, or a 503 saying `missing` (what is not available in this process)."""
    found = provided(request, kind)
    if found is None:
        raise HTTPException(503, missing)
    return found
