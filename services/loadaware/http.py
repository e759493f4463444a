"""The extender's HTTP routes: kube-scheduler's verbs (filter, prioritize, bind), assume, explain, health, metrics.

Bodies are decoded and encoded with msgspec by services.loadaware.extender (no pydantic models: a request for
5,000 nodes must be answered in milliseconds). A malformed request (invalid UTF-8, a bad quantity, too deep) is a
400 with `{"error": message}`; a body over MAX_BODY_BYTES a 413 before it is read (services.common.bodies).
`create_app(..., verbs=False)` leaves out the scheduling verbs: the plain port of an extender that serves them over
mutual TLS (LoadAwareSettings.tls_cert_file) keeps only health, readiness, metrics and explain.
Served by `koordbus service loadaware` and `koordbus up` (koordbus.extender, over mutual TLS); exercised by
tests/integration/test_loadaware_http.py and bench/loadaware.py.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from fastapi import APIRouter, FastAPI, Request
from fastapi.responses import Response
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect

from schemas import kube
from services.common import bodies
from services.common.metrics import CONTENT_TYPE_LATEST, CollectorRegistry, render
from services.loadaware.extender import DECODE_ERRORS, BadRequest
from services.loadaware.service import LoadAwareService

JSON = "application/json"
MAX_BODY_BYTES = 32 * 1024 * 1024
"""Larger request bodies are refused with 413 before they are read. With nodeCacheCapable (the chart's default)
kube-scheduler sends node names, ~100 KB for 5,000 nodes; whole Node objects fit for a few thousand nodes."""


class _ExplainRequest(msgspec.Struct, kw_only=True):
    pod: kube.Pod
    node: str


_EXPLAIN = msgspec.json.Decoder(_ExplainRequest)


def create_app(
    service: LoadAwareService,
    registry: CollectorRegistry,
    *,
    verbs: bool = True,
    liveness: Callable[[], str | None] = lambda: None,
) -> FastAPI:
    """`liveness`: why the process should be restarted, or None (koordbus.runtime.bus_liveness); /healthz answers
    503 with it."""
    app = FastAPI(title="koordbus load-aware scheduler extender", docs_url=None, redoc_url=None, openapi_url=None)
    scheduling = APIRouter()
    app.add_middleware(bodies.BodyLimit, limit=MAX_BODY_BYTES, refuse=_error)
    app.add_exception_handler(ClientDisconnect, bodies.client_went_away)

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException) -> Response:
        return _error(exc.status_code, str(exc.detail))

    async def answer(verb: str, request: Request, call: Callable[[bytes], bytes]) -> Response:
        body = await request.body()
        try:
            return Response(call(body), media_type=JSON)
        except BadRequest as err:
            service.bad_request(verb)
            return Response(msgspec.json.encode({"error": str(err)}), status_code=400, media_type=JSON)

    @scheduling.post("/filter")
    async def filter_route(request: Request) -> Response:
        return await answer("filter", request, service.filter)

    @scheduling.post("/prioritize")
    async def prioritize_route(request: Request) -> Response:
        return await answer("prioritize", request, service.prioritize)

    @scheduling.post("/assume")
    async def assume_route(request: Request) -> Response:
        return await answer("assume", request, service.assume)

    @scheduling.post("/bind")
    async def bind_route(request: Request) -> Response:
        try:
            return Response(await service.bind(await request.body()), media_type=JSON)
        except BadRequest as err:
            service.bad_request("bind")
            return Response(msgspec.json.encode({"error": str(err)}), status_code=400, media_type=JSON)

    if verbs:
        app.include_router(scheduling)

    @app.post("/explain")
    async def explain_route(request: Request) -> Response:
        try:
            asked = _EXPLAIN.decode(await request.body())
        except DECODE_ERRORS as err:
            return _error(400, f"expected {{pod, node}}: {err}")
        return Response(msgspec.json.encode(service.explain(asked.pod, asked.node)), media_type=JSON)

    @app.get("/healthz")
    async def healthz() -> Response:
        if (reason := liveness()) is not None:
            return Response(msgspec.json.encode({"error": f"not alive: {reason}"}), status_code=503, media_type=JSON)
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
