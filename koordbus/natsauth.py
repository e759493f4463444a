"""NATS identities in a cluster: `koordbus service natsauth` (the auth callout: agents' ServiceAccount tokens →
their node's NATS user) and `koordbus creds ensure-cluster-secret` (the Secret holding the callout's account key
and the service users' passwords, made by the Helm chart's hook Job); and in docker-compose.yml: `koordbus creds
ensure-compose` (the same users as files: `make compose-creds`); and `koordbus up`'s embedded nats-server's users as
the chart has them (up_identities).
"""

from __future__ import annotations

import argparse
import secrets
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from koordbus.common import ServiceProcess, kube_client
from services.common import settings as settings_loader

SERVICE_USERS = ("natsauth", "nodemetric", "noderesource", "slo", "quota", "migration", "k8s", "api")
"""The control-plane processes of a cluster, each a NATS user of its own (natsauth in the callout's account)."""
COMPOSE_SERVICE_USERS = tuple(name for name in SERVICE_USERS if name != "natsauth")
"""docker-compose.yml's control-plane processes: a cluster's, without the callout (its agent has a user of its own)."""
UP_USERS_DIR = "nats-users"
"""`koordbus up` with its embedded nats-server: the data dir's directory of the credentials files of each
in-process service (`<service>.creds.json`) and of the agent (`agent.creds.json`), mode 0600, kept across starts."""
UP_SERVICE_USERS = ("nodemetric", "noderesource", "slo", "quota", "migration", "k8s", "loadaware", "api")
"""The parts of `up` that are a Deployment of their own in the Helm chart, each a NATS user `service-<name>` there
(SERVICE_USERS): with `up`'s embedded nats-server each connects as its own user too."""
UP_AGENT = "agent"
"""`koordbus up`'s agent's name among its NATS users."""
COMPOSE_NATS_DIR = "nats"
"""Where in the compose directory the identities go: the directory is this user's only (0700), the files in it
readable by anyone (0644) because each container reads its own through a bind mount as an unprivileged user."""


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
    client = await kube_client(process.stack, process.args.kubeconfig, "service natsauth")
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
        client = await kube_client(stack, args.kubeconfig, "creds ensure-cluster-secret")
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


def run_ensure_compose(args: argparse.Namespace) -> int:
    """Write docker-compose.yml's NATS identities into `<args.name>/nats/` (bus.auth.compose_identities): files
    already right are left as they are, so passwords stay across runs; a new node gets a new agent user."""
    from bus import auth

    where = Path(args.name) / COMPOSE_NATS_DIR
    where.mkdir(mode=0o700, parents=True, exist_ok=True)
    where.chmod(0o700)
    existing = {p.name: p.read_text() for p in where.iterdir() if p.is_file()}
    try:
        files = auth.compose_identities(existing, services=COMPOSE_SERVICE_USERS, node=args.node)
    except ValueError as e:
        raise SystemExit(f"koordbus creds: --node: {e}") from None
    written = []
    for name, text in files.items():
        path = where / name
        if existing.get(name) != text:
            staged = path.with_name(f".{name}.new")
            staged.write_text(text)
            staged.chmod(0o644)
            staged.replace(path)
            written.append(name)
        path.chmod(0o644)
    shown = ", ".join(written) if written else "nothing (every file was there)"
    print(f"koordbus creds: {where}: wrote {shown}", flush=True)
    return 0


def up_identities(data_dir: Path, *, creds: Path, node: str | None) -> tuple[dict[str, Path], str]:
    """The embedded nats-server's users as the Helm chart has them: a user per service (everything allowed) and the
    agent of `node` allowed only its node's subjects (as the chart's auth callout lets an agent in; `up` has no
    Kubernetes to check an agent's token against, so its agent is a user of the server's), each with its
    credentials file, kept across starts (koordbus.runtime.ensure_nats_user), plus `up`'s own (`creds`); part →
    credentials file, and the server's `authorization` block (bus.auth.render_authorization). Not the chart's
    accounts: the users stay in the server's global account, where a data dir of an earlier `up` keeps its
    streams (in an account KOORD they would not be seen)."""
    from bus import auth
    from koordbus import runtime

    where = data_dir / UP_USERS_DIR
    where.mkdir(mode=0o700, exist_ok=True)
    files = {name: where / f"{name}.creds.json" for name in UP_SERVICE_USERS}
    users = [runtime.ensure_nats_user(creds, service="up")]
    users += [runtime.ensure_nats_user(path, service=name) for name, path in files.items()]
    if node is not None:
        files[UP_AGENT] = where / f"{UP_AGENT}.creds.json"
        users.append(runtime.ensure_nats_user(files[UP_AGENT], node=node))
    return files, auth.render_authorization(users)
