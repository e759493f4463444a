"""NATS identities in a cluster: `koordbus service natsauth` (the auth callout: agents' ServiceAccount tokens →
their node's NATS user) and `koordbus creds ensure-cluster-secret` (the Secret holding the callout's account key
and the service users' passwords, made by the Helm chart's hook Job).
"""

from __future__ import annotations

import argparse
import secrets
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from koordbus.common import ServiceProcess
from services.common import settings as settings_loader

SERVICE_USERS = ("natsauth", "nodemetric", "noderesource", "slo", "quota", "migration", "k8s", "api")
"""The control-plane processes of a cluster, each a NATS user of its own (natsauth in the callout's account)."""


async def _kube_client(stack: AsyncExitStack, kubeconfig: str | None, command: str) -> Any:
    from services.k8s.client import KubeConfigError, api_client
    from services.k8s.settings import K8sSettings

    try:
        client = await api_client(settings_loader.load(K8sSettings, {"kubeconfig": kubeconfig}))
    except KubeConfigError as e:
        raise SystemExit(f"koordbus {command}: needs a cluster: {e}") from None
    stack.push_async_callback(client.close)
    return client


def natsauth_settings(args: argparse.Namespace) -> tuple[Any, Any]:
    """`service natsauth`'s settings and the issuer's key pair, read before anything connects."""
    from bus import nkeys
    from services.natsauth.settings import NatsAuthSettings

    settings = settings_loader.load(NatsAuthSettings)
    if not settings.agent_service_account:
        raise SystemExit("koordbus service natsauth: KOORDBUS_AGENT_SERVICE_ACCOUNT (namespace:name) is required")
    try:
        issuer = nkeys.from_seed(Path(settings.issuer_seed_file).read_text())
    except (OSError, ValueError) as e:
        raise SystemExit(f"koordbus service natsauth: the issuer seed (KOORDBUS_ISSUER_SEED_FILE): {e}") from None
    return settings, issuer


async def build_natsauth(process: ServiceProcess) -> dict[str, Any]:
    """The callout on the bus of the AUTH account's user (koordbus.service runs it: no streams there)."""
    from services.k8s.token_review import KubeTokenReviewer
    from services.natsauth.service import NatsAuthService

    settings, issuer = process.prepared
    client = await _kube_client(process.stack, process.args.kubeconfig, "service natsauth")
    audiences = [settings.token_audience] if settings.token_audience else None
    service = NatsAuthService(
        process.bus,
        KubeTokenReviewer(client, audiences=audiences),
        issuer=issuer,
        settings=settings,
        registry=process.registry,
    )
    await service.start()
    process.stack.push_async_callback(service.stop)
    return {}


async def run_ensure_cluster_secret(args: argparse.Namespace) -> int:
    from bus import auth
    from services.k8s import secrets as k8s_secrets

    services = tuple(s.strip() for s in (args.services or ",".join(SERVICE_USERS)).split(",") if s.strip())
    async with AsyncExitStack() as stack:
        client = await _kube_client(stack, args.kubeconfig, "creds ensure-cluster-secret")
        added = await k8s_secrets.ensure_keys(
            client,
            namespace=args.namespace,
            name=args.name,
            additions=lambda existing: auth.cluster_secret_additions(
                existing, services=services, issuer_random=secrets.token_bytes(32)
            ),
            labels={"app.kubernetes.io/name": "koordbus", "app.kubernetes.io/component": "nats-auth"},
        )
    shown = ", ".join(added) if added else "nothing (every key was there)"
    print(f"koordbus creds: Secret {args.namespace}/{args.name}: added {shown}", flush=True)
    return 0
