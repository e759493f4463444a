"""What the long-running subcommands (`up`, `agent`, `service <name>`, `api`, `db`) share: the common flags and
settings, the bus of a process joining an existing NATS, and a service process's HTTP port.
"""

from __future__ import annotations

import argparse
import re
import socket
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any, Literal

from koordbus.settings import CommonSettings
from services.common import settings as settings_loader

# The heavy parts (nats, sqlalchemy, fastapi, numpy) are imported by the subcommand that runs, so `koordbus calc`
# and `--help` start fast.


def local_node_name() -> str:
    """This host's name as a DNS-1123 node name."""
    name = re.sub(r"[^a-z0-9.-]", "-", socket.gethostname().lower()).strip("-.") or "localhost"
    return name[:253]


async def kube_client(stack: AsyncExitStack, kubeconfig: str | None, command: str) -> Any:
    """A kubernetes-asyncio ApiClient for the cluster (`kubeconfig`, else in-cluster), closed with `stack`; a
    SystemExit naming `command` when there is no usable cluster."""
    from services.k8s.client import KubeConfigError, api_client
    from services.k8s.settings import K8sSettings

    try:
        client = await api_client(settings_loader.load(K8sSettings, {"kubeconfig": kubeconfig}))
    except KubeConfigError as e:
        raise SystemExit(f"koordbus {command}: needs a cluster: {e}") from None
    stack.push_async_callback(client.close)
    return client


def common_settings(args: argparse.Namespace) -> CommonSettings:
    return settings_loader.load(
        CommonSettings,
        {
            "nats_url": args.nats_url,
            "database_url": args.database_url,
            "data_dir": getattr(args, "data_dir", None),
            "nats_creds": getattr(args, "nats_creds", None),
            "nats_token_file": getattr(args, "nats_token_file", None),
        },
    )


def add_common(p: argparse.ArgumentParser, *, embedded: bool) -> None:
    where = " (default: start an embedded one)" if embedded else " (required, or KOORDBUS_NATS_URL)"
    p.add_argument("--nats-url", help="NATS server URL" + where)
    p.add_argument(
        "--database-url",
        help="sqlite:///path or postgresql://user@host/db"
        + (" (default: SQLite in the data dir)" if embedded else " (or KOORDBUS_DATABASE_URL)"),
    )
    p.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING …")
    p.add_argument(
        "--log-format",
        default=None,
        choices=("text", "json"),
        help="text (default) or json: one JSON object per line, with the event id and node while an event is "
        "handled (or KOORDBUS_LOG_FORMAT)",
    )
    if not embedded:
        p.add_argument(
            "--nats-creds",
            default=None,
            help="NATS credentials file from `koordbus creds` (or KOORDBUS_NATS_CREDS; default: anonymous)",
        )
        p.add_argument(
            "--nats-token-file",
            default=None,
            help="connect to NATS with the token in this file, read again at every reconnect: an agent's projected "
            "ServiceAccount token for the NATS auth callout (or KOORDBUS_NATS_TOKEN_FILE)",
        )


async def open_cluster_bus(
    stack: AsyncExitStack, common: CommonSettings, *, name: str, ensure_streams: bool = True
) -> Any:
    """The bus of a process joining an existing NATS (KOORDBUS_NATS_URL) as the user of KOORDBUS_NATS_CREDS, its
    streams at KOORDBUS_STREAM_REPLICAS."""
    from koordbus import runtime

    url = require(common.nats_url, "--nats-url")
    return await runtime.open_bus(
        stack,
        url,
        name=name,
        replicas=common.stream_replicas,
        creds=common.nats_creds,
        token_file=common.nats_token_file,
        ensure_streams=ensure_streams,
    )


def require(value: str, what: str) -> str:
    if not value:
        raise SystemExit(f"koordbus: {what} is required (flag or environment variable)")
    return value


def routes_of(settings: Any) -> Any:
    """The services' route settings (services.common.component.RouteSettings) from the API's settings."""
    from services.common.component import RouteSettings

    return RouteSettings(page_limit_max=settings.page_limit_max, stale_after_seconds=settings.stale_after_seconds)


def watermark_defaults() -> dict[str, Any]:
    """How the API's watermarks view shows each decider that stated nothing yet (from each one's component)."""
    from services.loadaware import component as loadaware_component
    from services.migration import component as migration_component

    return {"loadaware": loadaware_component.watermark_defaults, "descheduler": migration_component.watermark_defaults}


def service_route_settings() -> Any:
    """The route settings of a service process's port (its API settings from KOORDBUS_* variables)."""
    from services.api.settings import ApiSettings

    return routes_of(settings_loader.load(ApiSettings))


async def serve_service_port(stack: AsyncExitStack, port: int, registry: Any, **context: Any) -> None:
    """A service process's HTTP port (0 = none): /healthz, /readyz, /metrics and the read routes of what it holds."""
    from koordbus import http_serve
    from services.api.app import ApiContext, create_app
    from services.api.settings import ApiSettings
    from services.common import auth

    if port:
        settings = settings_loader.load(ApiSettings, {"port": port})
        # without a token file the read routes accept no token (health and metrics stay open)
        tokens = auth.load_token_file(settings.api_tokens_file) if settings.api_tokens_file else auth.TokenStore()
        app = create_app(ApiContext(settings=settings, registry=registry, tokens=tokens, **context))
        await http_serve.serve_http(stack, app, host="0.0.0.0", port=port)


@dataclass(frozen=True)
class ServiceProcess:
    """What `koordbus service <name>` holds open when it builds its service (koordbus.service.run_service)."""

    args: argparse.Namespace
    stack: AsyncExitStack
    bus: Any
    registry: Any
    engine: Any
    """The database's engine, None without one."""
    prepared: Any
    """What the service's `prepare` read before anything connected (None without a `prepare`)."""


@dataclass(frozen=True)
class ServiceRunner:
    """How `koordbus service <name>` runs one service: every service process parses the common settings, configures
    logging, reads what must be good before anything connects (`prepare`), opens the bus (and database), builds the
    service (`build`) and serves its HTTP port until Ctrl-C / SIGTERM."""

    build: Callable[[ServiceProcess], Awaitable[dict[str, Any] | None]]
    """Starts the service (closing it with the stack) and returns the context of its port (serve_service_port)
    beyond the defaults, or None when it serves a port of its own. Readiness checks it returns follow the default
    ones (the database when required, the bus)."""
    prepare: Callable[[argparse.Namespace], Any] | None = None
    """Settings read at the edge: a bad one stops the process here, before anything connects."""
    database: Literal["none", "required", "optional"] = "none"
    """"required": --database-url or KOORDBUS_DATABASE_URL must be given; "optional": used when given."""
    ensure_streams: bool = True
    """False where the process's NATS user may not create streams (natsauth's user is in the AUTH account)."""
    liveness: bool = True
    """/healthz fails when the bus is lost past a bound (koordbus.runtime.bus_liveness)."""
