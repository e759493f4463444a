"""The agent's HTTP port: /healthz, /readyz and /metrics in a few lines of asyncio instead of the API gateway's
FastAPI application.

An agent runs on every node, so what it imports is paid once per node: the web framework, its validation library and
the database toolkit the gateway needs made the agent process twice as large (see bench/agent.py). The answers have
the gateway's shapes: /healthz `{"status": "ok"}`; /readyz `{"status": "ready", "checked": [...]}` or 503 with
`{"error": "not ready: bus (reason)", "failures": {...}}` (a check that has not answered within `timeout` fails);
/metrics the registry in Prometheus text format. GET and HEAD only (405 otherwise), unknown paths 404, one request
per connection; a request head larger than 8 KiB or slower than 5 s is dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from http import HTTPStatus

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

log = logging.getLogger(__name__)

ReadinessCheck = Callable[[], Awaitable[str | None]]
"""None when the dependency answers, else why not; raising counts as failing with the exception as the reason."""

MAX_HEAD_BYTES = 8192
HEAD_TIMEOUT_SECONDS = 5.0


class AgentPort:
    def __init__(
        self,
        registry: CollectorRegistry,
        readiness: Sequence[tuple[str, ReadinessCheck]] = (),
        *,
        timeout: float = 2.0,
    ) -> None:
        self.registry = registry
        self.readiness = readiness
        self.timeout = timeout
        self._server: asyncio.Server | None = None

    async def start(self, host: str, port: int) -> int:
        """Listen on host:port (0: a free port); returns the port."""
        self._server = await asyncio.start_server(self._serve, host, port, limit=MAX_HEAD_BYTES)
        return int(self._server.sockets[0].getsockname()[1])

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_TIMEOUT_SECONDS)
            method, _, rest = head.decode("latin-1").partition(" ")
            path = rest.partition(" ")[0].partition("?")[0]
            status, content_type, body = await self.answer(method, path)
            writer.write(
                f"HTTP/1.1 {status.value} {status.phrase}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode("latin-1")
                + (b"" if method == "HEAD" else body)
            )
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError, ConnectionError, ValueError):
            pass  # a client that went away or sent no complete request head: nothing to answer
        finally:
            writer.close()
            with contextlib.suppress(ConnectionError):
                await writer.wait_closed()

    async def answer(self, method: str, path: str) -> tuple[HTTPStatus, str, bytes]:
        if path not in ("/healthz", "/readyz", "/metrics"):
            return _json(HTTPStatus.NOT_FOUND, {"error": f"no route {path!r}: try /healthz, /readyz or /metrics"})
        if method not in ("GET", "HEAD"):
            return _json(HTTPStatus.METHOD_NOT_ALLOWED, {"error": f"{path} answers GET and HEAD only"})
        if path == "/healthz":
            return _json(HTTPStatus.OK, {"status": "ok"})
        if path == "/metrics":
            return HTTPStatus.OK, CONTENT_TYPE_LATEST, generate_latest(self.registry)
        failures = {name: reason for name, check in self.readiness if (reason := await self._check(check))}
        if failures:
            named = ", ".join(f"{name} ({reason})" for name, reason in failures.items())
            return _json(HTTPStatus.SERVICE_UNAVAILABLE, {"error": f"not ready: {named}", "failures": failures})
        return _json(HTTPStatus.OK, {"status": "ready", "checked": [name for name, _ in self.readiness]})

    async def _check(self, check: ReadinessCheck) -> str | None:
        try:
            return await asyncio.wait_for(check(), self.timeout)
        except TimeoutError:
            return f"no answer within {self.timeout:g} s"
        except Exception as e:  # any failure of the dependency is a reason, never a 500
            return f"{type(e).__name__}: {e}" if str(e) else type(e).__name__


def _json(status: HTTPStatus, document: object) -> tuple[HTTPStatus, str, bytes]:
    return status, "application/json", json.dumps(document).encode()
