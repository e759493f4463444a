"""`koordbus api`: the REST API against an existing NATS and database, and its token store (shared with `up`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from koordbus import arg_types
from koordbus.common import add_common, common_settings, open_cluster_bus, require, routes_of, watermark_defaults
from services.common import settings as settings_loader

if TYPE_CHECKING:
    from services.api.settings import ApiSettings
    from services.common.auth import TokenStore

log = logging.getLogger(__name__)


API_TOKEN_FILE = "api-token"
"""`koordbus up` without a token file: the generated admin token, in the data dir (mode 0600)."""


def add_parser(sub: Any) -> None:
    api = sub.add_parser("api", help="run the REST API against an existing NATS and database")
    add_common(api, embedded=False)
    api.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    api.add_argument("--port", type=arg_types.port, default=8080, help="port (default 8080)")
    api.add_argument(
        "--api-tokens-file", default=None, help="token file, 'token role [name]' per line (required unless --no-auth)"
    )
    api.add_argument(
        "--no-auth", action="store_true", help="INSECURE: serve every route to anyone, without bearer tokens"
    )
    api.add_argument(
        "--token-review-roles",
        default=os.environ.get("KOORDBUS_TOKEN_REVIEW_ROLES", ""),
        metavar="MAPPING",
        help="also accept tokens Kubernetes vouches for (TokenReview, in-cluster or --kubeconfig), with roles by user "
        "or group, e.g. 'group:koordbus-viewers=viewer,user:alice=admin' (or KOORDBUS_TOKEN_REVIEW_ROLES)",
    )
    api.add_argument("--kubeconfig", default=None, help="with --token-review-roles: the cluster (default: in-cluster)")
    api.set_defaults(run=lambda a: asyncio.run(run_api(a)))


def api_tokens(settings: ApiSettings, *, command: str, data_dir: Path | None = None) -> TokenStore:
    """The API's TokenStore: from the token file; else (`up`) the admin token in the data dir, generated on first
    start; else the command cannot start. With auth disabled every caller is admin, which is logged loudly."""
    from services.common import auth

    if not settings.auth_enabled:
        log.warning("API AUTHENTICATION IS DISABLED: anyone who reaches the port can read and change everything")
        return auth.TokenStore.disabled()
    if settings.api_tokens_file:
        try:
            return auth.load_token_file(settings.api_tokens_file)
        except auth.TokenFileError as e:
            raise SystemExit(f"koordbus {command}: {e}") from e
    if data_dir is None:
        raise SystemExit(
            f"koordbus {command}: no API token file: pass --api-tokens-file (or set KOORDBUS_API_TOKENS_FILE) "
            "with 'token role [name]' lines, or --no-auth to serve without authentication (insecure)"
        )
    path = data_dir / API_TOKEN_FILE
    token, created = auth.ensure_admin_token(path)
    log.info(
        "API admin token %s %s (send it as 'Authorization: Bearer <token>')",
        "written to" if created else "read from",
        path,
    )
    return auth.TokenStore.single(token, name="koordbus-up")


async def event_hub(stack: AsyncExitStack, bus: Any, settings: Any) -> Any:
    """The API's event subscriptions (services.api.event_hub), closed with the stack."""
    from services.api.event_hub import EventHub

    hub = EventHub(
        bus,
        queue_size=settings.events_queue_size,
        max_subscriptions=settings.events_max_subscriptions,
        max_per_caller=settings.events_max_per_caller,
    )
    stack.push_async_callback(hub.close)
    return hub


async def _token_review(stack: AsyncExitStack, roles: dict[str, str], kubeconfig: str | None) -> Any:
    """Tokens Kubernetes vouches for, with `roles`: a TokenReview client on the cluster."""
    from services.common import auth
    from services.k8s.client import KubeConfigError, api_client
    from services.k8s.settings import K8sSettings
    from services.k8s.token_review import KubeTokenReviewer

    try:
        client = await api_client(settings_loader.load(K8sSettings, {"kubeconfig": kubeconfig}))
    except KubeConfigError as e:
        raise SystemExit(f"koordbus api: TokenReview needs a cluster: {e}") from None
    stack.push_async_callback(client.close)
    return auth.ReviewedTokens(KubeTokenReviewer(client), roles)


async def run_api(args: argparse.Namespace) -> int:
    from koordbus import http_serve, runtime
    from services.api.app import ApiContext, create_app
    from services.api.settings import ApiSettings
    from services.common import auth, observe
    from services.common.metrics import new_registry
    from services.common.watermark_feed import WatermarkReader
    from services.loadaware import component as loadaware_component
    from services.loadaware.client import LoadAwareClient
    from services.migration import component as migration_component
    from services.migration.client import MigrationClient
    from services.migration.store import MigrationStore
    from services.nodemetric import component as nodemetric_component
    from services.nodemetric.store import NodeMetricStore
    from services.noderesource import component as noderesource_component
    from services.noderesource.store import NodeResourceStore
    from services.quota import component as quota_component
    from services.quota.client import QuotaClient
    from services.quota.store import QuotaStore
    from services.slo import component as slo_component
    from services.webhook import component as webhook_component

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    settings = settings_loader.load(
        ApiSettings,
        {
            "host": args.host,
            "port": args.port,
            "api_tokens_file": args.api_tokens_file,
            "auth_enabled": False if args.no_auth else None,
        },
    )
    tokens = api_tokens(settings, command="api")
    try:
        review_roles = auth.parse_role_mapping(args.token_review_roles)
    except ValueError as e:
        raise SystemExit(f"koordbus api: --token-review-roles: {e}") from None
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        reviewed = await _token_review(stack, review_roles, args.kubeconfig) if review_roles else None
        bus = await open_cluster_bus(stack, common, name="api")
        engine = await runtime.open_database(stack, require(common.database_url, "--database-url"), migrate=False)
        hub = await event_hub(stack, bus, settings)
        app = create_app(
            ApiContext(
                settings=settings,
                components=(
                    nodemetric_component.reads(NodeMetricStore(engine), routes_of(settings), bus=bus),
                    noderesource_component.reads(NodeResourceStore(engine)),
                    quota_component.routes_over(QuotaStore(engine), QuotaClient(bus, registry=registry)),
                    migration_component.routes_over(MigrationStore(engine), MigrationClient(bus)),
                    loadaware_component.queries(LoadAwareClient(bus)),
                    slo_component.reads(bus),
                    webhook_component.profiles(bus),
                ),
                watermark_reader=WatermarkReader(bus),
                watermark_defaults=watermark_defaults(),
                event_hub=hub,
                registry=registry,
                tokens=tokens,
                reviewed_tokens=reviewed,
                readiness=(("database", observe.database_ready(engine)), ("bus", observe.bus_ready(bus))),
                liveness=(("bus", runtime.bus_liveness(bus)),),
            )
        )
        await http_serve.serve_http(stack, app, host=settings.host, port=settings.port, end_streams=hub.end_streams)
        await stop.wait()
    return 0
