"""The API gateway's FastAPI application: REST reads, health, readiness, Prometheus metrics and the OpenAPI docs.

`create_app` is called by the CLI (`koordbus up`, `koordbus api`, `koordbus service`) and the
tests with the store, settings and metrics registry already built; routes reach them through
`request.app.state.context`, so a test builds its own ApiContext (clock included). Every error
is JSON `{"error": "<one clear sentence>"}`: unknown routes and nodes, bad query parameters,
wrong methods, failing readiness and unexpected exceptions alike; a stack trace goes to the
log, never to the client. A query key a route does not declare is a 400 naming it (services.api.query_keys); a name
that Kubernetes' rules refuse (schemas.names: nodes, quotas, trees, namespaces …) is a 422 naming the parameter
before it reaches a store or the bus. Every /api/v1 route needs a bearer token with
role viewer or higher (services.common.auth); quota writes need quota-admin; /healthz, /readyz, /metrics, the docs
and the dashboard's static files (services.api.dashboard) stay open.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec
from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bus.errors import BusUnavailableError
from schemas import names
from services.api import (
    dashboard,
    docs,
    events,
    query_keys,
    watermarks,
)
from services.api.event_hub import EventHub
from services.api.settings import ApiSettings
from services.common import auth, bodies
from services.common.component import Component, Provided
from services.common.metrics import CONTENT_TYPE_LATEST, CollectorRegistry, render
from services.common.observe import ReadinessCheck
from services.common.watermark_feed import WatermarkReader
from services.common.watermarks import DeciderDefaults

log = logging.getLogger(__name__)

MAX_BODY_BYTES: Final = 1024 * 1024
"""Larger bodies are refused with 413 before they are read, on every route (services.common.bodies.BodyLimit); a
route may refuse less (a request to the quota service that does not fit one NATS message once encoded is a 413 too).
"""
READINESS_TIMEOUT_SECONDS = 3.0
MAX_REASON_CHARS = 300


@dataclass(frozen=True, kw_only=True)
class ApiContext:
    """What the routes need, built once by the composition root."""

    settings: ApiSettings
    registry: CollectorRegistry
    components: Sequence[Component] = ()
    """The services' routers, what their routes read, readiness checks and metric refreshers (each service's
    component.py builds its own)."""
    readiness: Sequence[tuple[str, ReadinessCheck]] = ()
    """(dependency name, check) pairs; /readyz names each failing dependency."""
    liveness: Sequence[tuple[str, Callable[[], str | None]]] = ()
    """(dependency name, check) pairs, each cheap and synchronous: why the process should be restarted, or None;
    /healthz answers 503 naming each failing one (koordbus.runtime.bus_liveness: the bus lost past a bound)."""
    before_metrics: Sequence[Callable[[], None]] = ()
    """Gauge refreshers run before each /metrics render."""
    readiness_timeout_seconds: float = READINESS_TIMEOUT_SECONDS
    """A check that has not answered by then counts as failing (a hung database must not hang /readyz)."""
    watermark_defaults: Mapping[str, DeciderDefaults] = field(default_factory=dict)
    """How the watermarks view shows a decider ("loadaware", "descheduler") that stated nothing yet (each one's
    component provides it)."""
    watermark_reader: WatermarkReader | None = None
    """The slo-controller-config and the watermarks the scheduler and the descheduler stated, read from the bus
    (services.api.watermarks); None: that route answers 503."""
    event_hub: EventHub | None = None
    """Event subscriptions and history (services.api.events); None: those routes answer 503."""
    tokens: auth.TokenStore = field(default_factory=auth.TokenStore)
    reviewed_tokens: auth.ReviewedTokens | None = None
    """Tokens not in `tokens` are asked about with a Kubernetes TokenReview (and mapped to roles); None: not."""
    """Accepted bearer tokens; the default accepts none (auth.TokenStore.disabled() only for `--no-auth`)."""


class ErrorBody(BaseModel):
    """The body of every error response."""

    error: str


class NotReadyBody(ErrorBody):
    failures: dict[str, str]


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    400: {
        "model": ErrorBody,
        "description": "The request is malformed (a query parameter the route does not take, a body that is not UTF-8 "
        "JSON/YAML of the expected shape, nested too deep, a bad filter or time); the message says what and where",
    },
    404: {"model": ErrorBody, "description": "No such object"},
    413: {"model": ErrorBody, "description": "The body is over the limit (refused before it is read)"},
    422: {"model": ErrorBody, "description": "A query parameter is invalid"},
    500: {"model": ErrorBody, "description": "Unexpected server error (details in the server log)"},
    503: {"model": ErrorBody, "description": "A dependency (database, bus, a service) is not available"},
}

AUTH_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "Bearer token missing or unknown"},
    403: {"model": ErrorBody, "description": "The token's role is too low (the message names the role needed)"},
}


def _one_line(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= MAX_REASON_CHARS else flat[: MAX_REASON_CHARS - 1] + "…"


def validation_message(errors: Sequence[Any]) -> str:
    """One sentence naming every invalid parameter, what was given and what is expected."""
    parts: list[str] = []
    for error in errors:
        location = [str(p) for p in error.get("loc", ())]
        where = f"{location[0]} parameter {'.'.join(location[1:])!r}" if len(location) > 1 else ".".join(location)
        given = f" (got {error['input']!r})" if "input" in error and error["input"] is not None else ""
        parts.append(f"invalid {where or 'request'}{given}: {error.get('msg', 'invalid value')}")
    return "; ".join(parts) or "invalid request"


def http_error_message(request: Request, exc: StarletteHTTPException) -> str:
    """Starlette's generic details ("Not Found") say little; name the method and path instead."""
    if exc.status_code == 404 and exc.detail == "Not Found":
        return f"no route for {request.method} {request.url.path} (see /docs for the API)"
    if exc.status_code == 405:
        allowed = (exc.headers or {}).get("Allow", "")
        suffix = f"; allowed: {allowed}" if allowed else ""
        return f"method {request.method} is not allowed on {request.url.path}{suffix}"
    return str(exc.detail)


async def run_readiness(checks: Sequence[tuple[str, ReadinessCheck]], *, timeout: float) -> dict[str, str]:
    """Run every check concurrently; returns {dependency: reason} for those that failed."""

    async def one(check: ReadinessCheck) -> str | None:
        try:
            return await asyncio.wait_for(check(), timeout)
        except TimeoutError:
            return f"no answer within {timeout:g} s"
        except Exception as e:
            text = str(e)
            return f"{type(e).__name__}: {text}" if text else type(e).__name__

    reasons = await asyncio.gather(*(one(check) for _, check in checks))
    return {name: _one_line(reason) for (name, _), reason in zip(checks, reasons, strict=True) if reason}


class CatchAllMiddleware:
    """Turns an exception no handler took into a JSON 500 and logs it once, with its traceback.

    Starlette's own catch-all answers and then re-raises to the server, which logs the error a
    second time; this sits inside it, so it never sees the exception.
    """

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self._app(scope, receive, tracking_send)
        except Exception as exc:
            log.exception("unhandled error on %s %s", scope.get("method"), scope.get("path"))
            if started:  # the status line is gone; only the server can end the connection now
                raise
            body = {"error": f"internal error ({type(exc).__name__}); see the server log"}
            await JSONResponse(body, status_code=500)(scope, receive, send)


def create_app(context: ApiContext) -> FastAPI:
    app = FastAPI(
        title="koordbus",
        version="0.1.0",
        description="Co-location control plane for Kubernetes: NodeMetric and more, over NATS JetStream.",
        docs_url=None,  # services.api.docs serves the page without a CDN
        redoc_url=None,
    )
    app.state.context = context
    viewer = [Depends(auth.require(auth.VIEWER)), Depends(query_keys.refuse_unknown)]  # who, then what
    responses = {**ERROR_RESPONSES, **AUTH_RESPONSES}
    for component in context.components:
        for router in component.routers:
            app.include_router(router, responses=responses, dependencies=viewer)
    app.state.provided = Provided.of(context.components)
    app.include_router(watermarks.router, responses=responses, dependencies=viewer)
    app.include_router(events.router, responses=responses, dependencies=viewer)
    app.include_router(events.socket_router)  # authenticates and checks its keys itself (events.event_socket)
    app.include_router(dashboard.router, responses=responses, dependencies=viewer)
    app.add_middleware(CatchAllMiddleware)
    app.add_middleware(bodies.BodyLimit, limit=MAX_BODY_BYTES, refuse=_refuse)
    _add_audit_log(app, context)
    _add_request_metrics(app, context)
    _add_health_routes(app, context)
    _add_error_handlers(app)
    if context.event_hub is not None:
        context.registry.register(EventHubCollector(context.event_hub))
    dashboard.mount(app)
    docs.mount(app)
    _declare_body_schemas(app, context.components)
    return app


def _declare_body_schemas(app: FastAPI, parts: Sequence[Component]) -> None:
    """The OpenAPI document declares the bodies' real schemas (the routes read their bodies themselves, as JSON or
    YAML, so FastAPI does not know them): each Kubernetes object's JSON schema from its msgspec type, as a component
    the routes' request bodies refer to, so the documented contract can be checked (tests/security/
    test_schemathesis_api.py)."""
    build = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        document = build()
        _, components = msgspec.json.schema_components(
            tuple(t for part in parts for t in part.body_types),
            ref_template="#/components/schemas/{name}",
            schema_hook=_any_json,
        )
        declared = document.setdefault("components", {}).setdefault("schemas", {})
        if clash := set(declared) & set(components):
            raise RuntimeError(f"body schemas named like the API's own: {sorted(clash)}")
        declared.update(components)
        return document

    app.openapi = openapi  # type: ignore[method-assign]


def _any_json(cls: type) -> dict[str, Any]:
    if cls is object:  # `dict[str, object]`: any JSON value
        return {"description": "any JSON value"}
    raise NotImplementedError


def _refuse(status: int, message: str) -> ASGIApp:
    return JSONResponse({"error": message}, status_code=status)


class EventHubCollector:
    """The event hub's figures, read at each scrape."""

    def __init__(self, hub: EventHub) -> None:
        self._hub = hub

    def collect(self) -> Iterator[Metric]:
        hub = self._hub
        yield GaugeMetricFamily(
            "koordbus_api_event_subscriptions",
            "Event subscriptions (SSE and WebSocket) open now",
            value=hub.subscriptions,
        )
        yield CounterMetricFamily(
            "koordbus_api_event_subscriptions_dropped",
            "Event subscriptions dropped for not reading fast enough",
            value=hub.dropped,
        )
        yield CounterMetricFamily(
            "koordbus_api_events_read", "Messages the event tails read from the streams", value=hub.delivered
        )


AUDIT = logging.getLogger("koordbus.audit")
READS = frozenset({"GET", "HEAD", "OPTIONS"})


def _add_audit_log(app: FastAPI, context: ApiContext) -> None:
    """Every write (any method but GET, HEAD, OPTIONS), allowed or refused, becomes one JSON line on the
    `koordbus.audit` logger — who (the token's name and role; "unknown" without a valid token), what, the answer —
    and is counted in koordbus_api_writes_total."""
    writes = Counter(
        "koordbus_api_writes", "API write requests by role and answer", ["role", "method", "status"],
        registry=context.registry,
    )  # fmt: skip

    @app.middleware("http")
    async def audit(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        if request.method in READS:
            return await call_next(request)
        started = time.monotonic()
        response = await call_next(request)
        identity: auth.Identity | None = getattr(request.state, "identity", None)
        record = {
            "who": identity.name if identity else "unknown",
            "role": identity.role if identity else "",
            "method": request.method,
            "path": request.url.path,
            "query": request.url.query,
            "status": response.status_code,
            "idempotency_key": request.headers.get("Idempotency-Key", ""),
            "client": request.client.host if request.client else "",
            "ms": round((time.monotonic() - started) * 1000, 1),
        }
        AUDIT.info(json.dumps(record))
        writes.labels(role=record["role"] or "none", method=request.method, status=str(response.status_code)).inc()
        return response


REQUEST_SECONDS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Reads answer from the database in milliseconds; commands wait on the bus (and a quota service) for longer."""
KNOWN_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "POST", "PUT", "PATCH", "DELETE"})


def _add_request_metrics(app: FastAPI, context: ApiContext) -> None:
    """Every request's handling time in koordbus_api_request_seconds, labelled by its route's template (never the
    path itself, which names nodes and quotas), the method and the status."""
    seconds = Histogram(
        "koordbus_api_request_seconds",
        "HTTP requests by method, route template (unmatched: no route serves the path) and status: seconds until "
        "the response starts",
        ["method", "route", "status"],
        buckets=REQUEST_SECONDS_BUCKETS,
        registry=context.registry,
    )

    @app.middleware("http")
    async def timed(request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
        started = time.monotonic()
        response = await call_next(request)
        route = getattr(request.scope.get("route"), "path", None) or "unmatched"
        method = request.method if request.method in KNOWN_METHODS else "other"
        seconds.labels(method=method, route=route, status=str(response.status_code)).observe(time.monotonic() - started)
        return response


def _add_health_routes(app: FastAPI, context: ApiContext) -> None:
    no_keys = [Depends(query_keys.refuse_unknown)]
    readiness = [*context.readiness, *(check for c in context.components for check in c.readiness)]
    before_metrics = [*context.before_metrics, *(refresh for c in context.components for refresh in c.before_metrics)]
    unknown_key: dict[int | str, dict[str, Any]] = {
        400: {"model": ErrorBody, "description": "A query parameter was given: these routes take none"}
    }

    @app.get(
        "/healthz",
        dependencies=no_keys,
        tags=["health"],
        summary="The process is alive (its bus has not been lost past a bound)",
        responses={
            **unknown_key,
            503: {"model": NotReadyBody, "description": "Restart the process; `failures` says why"},
        },
    )
    async def healthz() -> JSONResponse:
        failures = {name: reason for name, check in context.liveness if (reason := check()) is not None}
        if failures:
            named = ", ".join(f"{name} ({reason})" for name, reason in failures.items())
            return JSONResponse({"error": f"not alive: {named}", "failures": failures}, status_code=503)
        return JSONResponse({"status": "ok"})

    @app.get(
        "/readyz",
        dependencies=no_keys,
        tags=["health"],
        summary="Every dependency answers (database, bus)",
        responses={
            **unknown_key,
            503: {"model": NotReadyBody, "description": "A dependency is failing; `failures` says which"},
        },
    )
    async def readyz() -> JSONResponse:
        failures = await run_readiness(readiness, timeout=context.readiness_timeout_seconds)
        if failures:
            named = ", ".join(f"{name} ({reason})" for name, reason in failures.items())
            return JSONResponse({"error": f"not ready: {named}", "failures": failures}, status_code=503)
        return JSONResponse({"status": "ready", "checked": [name for name, _ in readiness]})

    @app.get(
        "/metrics",
        dependencies=no_keys,
        tags=["health"],
        summary="Prometheus metrics (text format)",
        response_class=Response,
        responses={
            200: {"content": {CONTENT_TYPE_LATEST: {}}, "description": "Prometheus text exposition"},
            **unknown_key,
        },
    )
    async def metrics() -> Response:
        for refresh in before_metrics:
            refresh()
        return Response(render(context.registry), media_type=CONTENT_TYPE_LATEST)


def _add_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(ClientDisconnect, bodies.client_went_away)

    @app.exception_handler(BusUnavailableError)
    async def bus_unavailable(request: Request, exc: BusUnavailableError) -> JSONResponse:
        """The bus did not answer in time (a loaded or restarting nats-server): the caller may try again; not a bug
        of ours, so no traceback (a route that can say more catches it itself)."""
        log.warning("%s %s: the bus did not answer: %s", request.method, request.url.path, exc)
        return JSONResponse({"error": f"the bus did not answer; try again ({exc})"}, status_code=503)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse(
            {"error": http_error_message(request, exc)}, status_code=exc.status_code, headers=exc.headers
        )

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        return JSONResponse({"error": validation_message(exc.errors())}, status_code=422)

    @app.exception_handler(names.InvalidName)
    async def invalid_name(request: Request, exc: names.InvalidName) -> JSONResponse:
        """A name in a path, query or body that Kubernetes' rules refuse (schemas.names): it never goes further."""
        return JSONResponse({"error": str(exc)}, status_code=422)
