"""Serving HTTP inside a command's event loop: uvicorn over plain HTTP, HTTPS or mutual TLS, stopped with its
command's AsyncExitStack; and `reserve`, a port held from the moment it is checked, so nothing takes it while the
command starts its other parts (koordbus.up).

Called by the subcommands that serve (koordbus.up, koordbus.api, koordbus.service, koordbus.webhook,
koordbus.extender, a service's own port in koordbus.common) and by the integration tests. The command, not uvicorn,
owns SIGINT/SIGTERM (koordbus.runtime.stop_event_on_signals); the web server is imported where it starts, so a
command that serves nothing (`koordbus agent`) never loads it.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import uvicorn
    from fastapi import FastAPI


def reserve(host: str, port: int) -> socket.socket | None:
    """A socket listening on `port` of `host` (0: a free one) for `serve_http` to serve on later, or None when
    something else holds the port. Until the server starts, connections wait in the backlog rather than being
    refused. Checking a port and binding it only once the command had started its other parts left seconds in which
    another socket could take it — an outgoing connection's local port too, for a port the kernel had picked from
    its ephemeral range — and uvicorn then ended the process with exit code 3. The caller closes the socket if it
    never serves (a socket is a context manager)."""
    s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    # As uvicorn binds: a connection of a process just killed, in TIME_WAIT, does not make the port busy.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        s.bind((host, port))
        s.listen()
    except OSError:
        s.close()
        return None
    return s


@dataclass(frozen=True, kw_only=True)
class MutualTls:
    """Serve HTTPS with this certificate and key (PEM files) only to clients presenting a certificate that chains to
    `client_ca_file`; the handshake refuses any other client."""

    cert_file: str
    key_file: str
    client_ca_file: str


async def serve_http(
    stack: AsyncExitStack,
    app: FastAPI,
    *,
    host: str,
    port: int,
    tls: MutualTls | None = None,
    ssl_context: ssl.SSLContext | None = None,
    end_streams: Callable[[], None] | None = None,
    reserved: socket.socket | None = None,
) -> uvicorn.Server:
    """Run uvicorn inside this event loop until the stack closes (over mutual TLS when `tls` is given, or over HTTPS
    with `ssl_context`, which the caller keeps: services.webhook.tls swaps certificates through it). `end_streams`
    ends the app's open streaming responses (event subscriptions): it is called first when the server stops, since
    uvicorn's graceful shutdown waits for open responses to finish. `reserved`: the socket `reserve` bound to
    host:port, listened on instead of binding anew."""
    import uvicorn

    ssl_options: dict[str, object] = {}
    if ssl_context is not None:
        ssl_options = {"ssl_context_factory": lambda _config, _default: ssl_context}
    elif tls is not None:
        ssl_options = {
            "ssl_certfile": tls.cert_file,
            "ssl_keyfile": tls.key_file,
            "ssl_ca_certs": tls.client_ca_file,
            "ssl_cert_reqs": ssl.CERT_REQUIRED,
        }
    # A response still open past 3 s of shutdown (a stream nobody ended) is cancelled.
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level="warning",
        lifespan="off",
        access_log=False,
        timeout_graceful_shutdown=3,
        **ssl_options,  # type: ignore[arg-type]
    )
    server = uvicorn.Server(config)
    # The CLI owns SIGINT/SIGTERM (stop_event_on_signals); uvicorn must not take them over.
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve(sockets=None if reserved is None else [reserved]), name="http")

    async def stop() -> None:
        if end_streams is not None:
            end_streams()
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, timeout=10)

    stack.push_async_callback(stop)
    for _ in range(200):
        if server.started or task.done():
            break
        await asyncio.sleep(0.05)
    if task.done():
        task.result()
        raise RuntimeError(f"the HTTP server on {host}:{port} stopped during start-up")
    return server
