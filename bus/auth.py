"""Who may do what on NATS: a user per node agent, allowed to publish only its own node's subjects
(`koord.v1.node.<node>.>`) and to read only its own NodeSLO key (a direct get of `$KV.KOORD_SLO.<node>`), and users
for the control-plane services, allowed everything. Pure: it renders the `authorization` block of a nats-server
config from `NatsUser`s (`koordbus up`'s) or the chart's `accounts`/`authorization` blocks, reads and writes
the credentials files the processes connect with (`koordbus creds`), and makes the identities of a cluster's Secret
and of docker-compose.yml's NATS.

A credentials file is JSON `{"user": …, "password": …}`; the server config carries the same password (mount both
as Kubernetes Secrets). Every connection authenticates, `koordbus up`'s to its embedded server included (a
generated user per in-process service and one for its agent's node, as the chart has them: koordbus.up).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bus import nkeys, streams, subjects
from schemas import names


@dataclass(frozen=True, kw_only=True)
class NatsUser:
    user: str
    password: str
    permissions: Mapping[str, Any] | None = None
    """nats-server permissions; None: everything (a control-plane service)."""


def node_user_name(node: str) -> str:
    return f"node-{subjects.encode_token(node)}"


def node_permissions(node: str) -> dict[str, Any]:
    """An agent publishes its node's reports, events and eviction requests, reads its own NodeSLO key and its own
    node's last batch/mid decision, and receives the replies to its own requests (JetStream acks and the direct
    gets' answers, on its inbox)."""
    return {
        "publish": {
            "allow": [
                subjects.node_prefix(node),
                f"$JS.API.DIRECT.GET.{streams.KV_KOORD_SLO}.{subjects.slo_key(node)}",
                f"$JS.API.DIRECT.GET.{streams.KOORD_NODERESOURCE}.{subjects.noderesource_computed(node)}",
            ]
        },
        "subscribe": {"allow": ["_INBOX.>"]},
    }


def new_password() -> str:
    """256 random bits as a letter and hex digits: nats-server parses a `$VARIABLE`'s value as a config token, so
    a password from the environment must read as a bare string (one starting with a digit or `-` reads as a
    number and fails)."""
    return "k" + secrets.token_hex(32)


def issue_node(node: str) -> NatsUser:
    """Credentials for node `node`'s agent; schemas.names.InvalidName (a ValueError) when it is not a node name."""
    names.node_name(node)
    return NatsUser(user=node_user_name(node), password=new_password(), permissions=node_permissions(node))


def service_user_name(name: str) -> str:
    return f"service-{subjects.encode_token(name)}"


def issue_service(name: str) -> NatsUser:
    return NatsUser(user=service_user_name(name), password=new_password())


def render_authorization(users: Sequence[NatsUser]) -> str:
    """The `authorization { users = [...] }` block of a nats-server config (JSON values: the config format reads
    them)."""
    entries = []
    for user in users:
        entry: dict[str, Any] = {"user": user.user, "password": user.password}
        if user.permissions is not None:
            entry["permissions"] = user.permissions
        entries.append(json.dumps(entry))
    return "authorization {\n  users = [\n" + "".join(f"    {e}\n" for e in entries) + "  ]\n}\n"


AUTH_CALLOUT_SUBJECT = "$SYS.REQ.USER.AUTH"
"""Where nats-server sends its authorization requests (to the callout's account)."""
CALLOUT_ACCOUNT = "AUTH"
"""The account of the auth callout's own user (nats-server sends it the authorization requests)."""
KOORD_ACCOUNT = "KOORD"
"""The account koordbus lives in (JetStream on): the service users, and every user the callout authorizes."""
AUTH_TIMEOUT_SECONDS = 5.0
"""How long nats-server waits for a client's authentication, the callout's answer included (its default is 2 s:
too short for a TokenReview when every agent reconnects at once)."""


def render_callout_authorization(
    *, issuer_public_key: str, callout_user: NatsUser, service_users: Sequence[NatsUser]
) -> str:
    """The `accounts` and `authorization` blocks of a nats-server config with an auth callout (server-config mode,
    no operator): `callout_user` (account AUTH) answers the authorization requests of every connection but the
    listed service users' (account KOORD, everything allowed), signing users into KOORD with the account key whose
    public key is `issuer_public_key`. Passwords may be `$VARIABLE`s the server reads from its environment. A user
    with `permissions` (an agent's, where no callout grants them: `chart_authorization`) gets them here."""

    entry = _account_entry
    koord_users = "".join(f"      {entry(u)}\n" for u in service_users)
    bypass = ", ".join(json.dumps(u.user) for u in (callout_user, *service_users))
    return (
        "accounts {\n"
        f"  {CALLOUT_ACCOUNT} {{\n    users = [\n      {entry(callout_user)}\n    ]\n  }}\n"
        f"  {KOORD_ACCOUNT} {{\n    jetstream: enabled\n    users = [\n{koord_users}    ]\n  }}\n"
        "}\n"
        "authorization {\n"
        f"  timeout: {AUTH_TIMEOUT_SECONDS:g}\n"
        "  auth_callout {\n"
        f"    issuer: {issuer_public_key}\n"
        f"    account: {CALLOUT_ACCOUNT}\n"
        f"    auth_users: [{bypass}]\n"
        "  }\n"
        "}\n"
    )


def _account_entry(user: NatsUser) -> str:
    password = user.password if user.password.startswith("$") else json.dumps(user.password)
    permissions = "" if user.permissions is None else f", permissions: {json.dumps(user.permissions)}"
    return f"{{user: {json.dumps(user.user)}, password: {password}{permissions}}}"


def chart_authorization(users: Sequence[NatsUser], *, issuer_random: bytes) -> str:
    """The `accounts`/`authorization` blocks the Helm chart renders (render_callout_authorization), for servers with
    no callout running (the cluster test fixture): `users` in KOORD, checked by the server itself —
    the services', everything allowed, and an agent's with its node's permissions (bus.auth.node_permissions, what
    the callout would grant it) — and the callout's user in AUTH with a password nobody is given. `issuer_random`
    (32 bytes) makes the callout's account key, of which the config holds only the public half."""
    issuer = nkeys.from_random(nkeys.Prefix.ACCOUNT, issuer_random)
    return render_callout_authorization(
        issuer_public_key=issuer.public_key, callout_user=issue_service("natsauth"), service_users=users
    )


ISSUER_SEED_KEY = "issuer-seed"
ISSUER_PUBLIC_KEY_KEY = "issuer-public-key"
ROUTE_PASSWORD_KEY = "route-password"
"""The cluster Secret's key holding the password a clustered nats-server's routes present (user ROUTE_USER)."""
ROUTE_USER = "route"


def password_key(service: str) -> str:
    """The cluster Secret's key holding a service user's password (for the nats-server config's environment)."""
    return f"{service}-password"


def creds_key(service: str) -> str:
    """The cluster Secret's key holding a service's credentials file (mounted into its pods)."""
    return f"{service}.creds.json"


def cluster_secret_additions(
    existing: Mapping[str, str], *, services: Sequence[str], issuer_random: bytes
) -> dict[str, str]:
    """What a release's NATS Secret lacks: the callout's account key (from `issuer_random`, 32 random bytes), the
    routes' password and, per service, a user `service-<name>` with a new password, as a password and as a
    credentials file. Keys present stay as they are (a service whose two keys disagree gets both anew)."""
    added: dict[str, str] = {}
    if ISSUER_SEED_KEY not in existing or ISSUER_PUBLIC_KEY_KEY not in existing:
        issuer = nkeys.from_random(nkeys.Prefix.ACCOUNT, issuer_random)
        added |= {ISSUER_SEED_KEY: issuer.seed, ISSUER_PUBLIC_KEY_KEY: issuer.public_key}
    if ROUTE_PASSWORD_KEY not in existing:
        added[ROUTE_PASSWORD_KEY] = new_password()
    for name in services:
        if _matching(existing.get(password_key(name)), existing.get(creds_key(name))):
            continue
        user = issue_service(name)
        added |= {password_key(name): user.password, creds_key(name): creds_json(user)}
    return added


def _matching(password: str | None, creds: str | None) -> bool:
    try:
        return password is not None and creds is not None and read_creds(creds, source="")[1] == password
    except ValueError:
        return False


def creds_json(user: NatsUser) -> str:
    return json.dumps({"user": user.user, "password": user.password}) + "\n"


def read_creds(text: str, *, source: str) -> tuple[str, str]:
    """(user, password) from a credentials file's text; ValueError naming `source` when it is not one."""
    try:
        document = json.loads(text)
        return str(document["user"]), str(document["password"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f'{source} is not a koordbus NATS credentials file ({{"user", "password"}}): {e}') from e


COMPOSE_AUTHORIZATION_FILE = "auth.conf"
COMPOSE_AGENT = "agent"


def compose_creds_file(process: str) -> str:
    """The name of a docker-compose.yml process's credentials file (a service's name, or COMPOSE_AGENT)."""
    return f"{process}.creds.json"


def compose_identities(existing: Mapping[str, str], *, services: Sequence[str], node: str) -> dict[str, str]:
    """docker-compose.yml's NATS identities as files (name → text), from the files `existing` there: a credentials
    file per service (user `service-<name>`, everything allowed) and one for the agent of `node` (user
    `node-<node>`, its own node's subjects only, as the auth callout grants an agent in a cluster), each kept when
    it is already there for that user, and the server's `authorization` block (COMPOSE_AUTHORIZATION_FILE) letting
    in exactly these users. schemas.names.InvalidName (a ValueError) when `node` is not a node name."""
    names.node_name(node)
    users = [_kept(existing.get(compose_creds_file(n)), service_user_name(n)) or issue_service(n) for n in services]
    agent = _kept(existing.get(compose_creds_file(COMPOSE_AGENT)), node_user_name(node)) or issue_node(node)
    users.append(NatsUser(user=agent.user, password=agent.password, permissions=node_permissions(node)))
    files = {compose_creds_file(n): creds_json(u) for n, u in zip((*services, COMPOSE_AGENT), users, strict=True)}
    return files | {COMPOSE_AUTHORIZATION_FILE: render_authorization(users)}


def _kept(creds: str | None, user: str) -> NatsUser | None:
    """The user of a credentials file's text when it is `user`'s; None for none, another user's or an unreadable one."""
    if creds is None:
        return None
    try:
        name, password = read_creds(creds, source="")
    except ValueError:
        return None
    return NatsUser(user=name, password=password) if name == user else None
