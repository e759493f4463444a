"""The API gateway's FastAPI application: REST reads, health, readiness and Prometheus metrics.

`create_app` is called by the CLI (`koordbus up`, `koordbus api`) and the tests with the
store, settings and metrics registry already built; routes reach them through FastAPI
dependencies, so tests can override any of them. Errors are JSON with a clear message,
never a stack trace.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from services.api import nodemetrics
from services.api.settings import ApiSettings
from services.common.metrics import CONTENT_TYPE_LATEST, CollectorRegistry, render
from services.nodemetric.store import NodeMetricStore

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Awaitable[str | None]]
"""Returns None when ready, else a one-line reason."""


@dataclass(frozen=True, kw_only=True)
class ApiContext:
    """What the routes need, built once by the composition root."""

    settings: ApiSettings
    nodemetric_store: NodeMetricStore
    registry: CollectorRegistry
    readiness: Sequence[tuple[str, ReadinessCheck]] = ()
    before_metrics: Sequence[Callable[[], None]] = ()
    clock: Callable[[], float] = field(default=time.time)


def create_app(context: ApiContext) -> FastAPI:
    app = FastAPI(
        title="koordbus",
        version="0.1.0",
        description="Co-location control plane for Kubernetes: NodeMetric and more, over NATS JetStream.",
    )
    app.state.context = context
    app.include_router(nodemetrics.router)

    @app.get("/healthz", tags=["health"], summary="The process is alive")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/readyz", tags=["health"], summary="Every dependency answers (database, bus)")
    async def readyz() -> JSONResponse:
        failures: dict[str, str] = {}
        for name, check in context.readiness:
            try:
                reason = await check()
            except Exception as e:
                reason = f"{type(e).__name__}: {e}"
            if reason:
                failures[name] = reason
        if failures:
            return JSONResponse({"status": "not ready", "failures": failures}, status_code=503)
        return JSONResponse({"status": "ready"})

    @app.get("/metrics", tags=["health"], summary="Prometheus metrics (text format)")
    async def metrics() -> Response:
        for refresh in context.before_metrics:
            refresh()
        return Response(render(context.registry), media_type=CONTENT_TYPE_LATEST)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return JSONResponse({"error": str(exc.detail)}, status_code=exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        where = ".".join(str(p) for p in first.get("loc", ()))
        return JSONResponse({"error": f"{where}: {first.get('msg', 'invalid request')}"}, status_code=422)

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error on %s %s", request.method, request.url.path)
        return JSONResponse({"error": f"internal error ({type(exc).__name__}); see the server log"}, status_code=500)

    return app
