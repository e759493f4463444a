"""The webhook's HTTP app: every admission route of the service's table (POST /mutate-pods, /validate-configmaps, …),
health, readiness and metrics.

Bodies are read raw and decoded by the service (services.common.bodies: nesting deeper than 64 levels, invalid UTF-8
or JSON are refused); a body over MAX_BODY_BYTES is a 413 before it is read, one that is not an AdmissionReview v1
a 400 with `{"error": message}` naming the field: kube-apiserver then applies the webhook configuration's
failurePolicy. A decision is always a 200 with an AdmissionReview (a refusal is `allowed: false` in it).
`create_app(..., admission=False)` leaves the admission routes out: the plain port (--port) keeps health,
readiness and metrics for kubelet's probes and Prometheus. Served by `koordbus service webhook` over HTTPS
(koordbus.webhook); exercised by tests/integration/test_webhook_service.py and bench/webhook.py.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import msgspec
from fastapi import FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from services.common import bodies
from services.common.metrics import CONTENT_TYPE_LATEST, CollectorRegistry, render
from services.webhook.admission import BadReview
from services.webhook.service import WebhookService

JSON = "application/json"
MAX_BODY_BYTES = 3 * 1024 * 1024
"""kube-apiserver's own request body limit (3 MiB): an AdmissionReview carries one object (twice at UPDATE)."""


def create_app(
    service: WebhookService,
    registry: CollectorRegistry,
    *,
    admission: bool = True,
    liveness: Callable[[], str | None] = lambda: None,
) -> FastAPI:
    """`liveness`: why the process should be restarted, or None (koordbus.runtime.bus_liveness); /healthz answers
    503 with it."""
    app = FastAPI(title="koordbus admission webhook", docs_url=None, redoc_url=None, openapi_url=None)
    app.add_middleware(bodies.BodyLimit, limit=MAX_BODY_BYTES, refuse=_error)
    app.add_exception_handler(ClientDisconnect, bodies.client_went_away)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _error(exc.status_code, str(exc.detail))

    def route(path: str) -> Callable[[Request], Awaitable[Response]]:
        async def answer(request: Request) -> Response:
            try:
                return Response(await service.answer(path, await request.body()), media_type=JSON)
            except BadReview as err:
                return _error(400, str(err))

        return answer

    if admission:
        for path in service.routes:
            app.add_api_route(path, route(path), methods=["POST"])

    @app.get("/healthz")
    async def healthz() -> Response:
        if (reason := liveness()) is not None:
            return _error(503, f"not alive: {reason}")
        return Response(b'{"status":"ok"}', media_type=JSON)

    @app.get("/readyz")
    async def readyz() -> Response:
        ready = service.replayed
        return Response(msgspec.json.encode({"ready": ready}), status_code=200 if ready else 503, media_type=JSON)

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(render(registry), media_type=CONTENT_TYPE_LATEST)

    return app


def _error(status: int, message: str) -> Response:
    return Response(msgspec.json.encode({"error": message}), status_code=status, media_type=JSON)
