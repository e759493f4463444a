"""Who may do what on NATS: a user per node agent, allowed to publish only its own node's subjects
(`koord.v1.node.<node>.>`) and to read only its own NodeSLO key (a direct get of `$KV.KOORD_SLO.<node>`), and users
for the control-plane services, allowed everything. Pure: it renders the `authorization` block of a nats-server
config from `NatsUser`s, and reads and writes the credentials files the processes connect with (`koordbus creds`).

A credentials file is JSON `{"user": …, "password": …}`; the server config carries the same password (mount both
as Kubernetes Secrets). `koordbus up` stays anonymous on loopback; anywhere else every connection authenticates.
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from bus import streams, subjects


@dataclass(frozen=True, kw_only=True)
class NatsUser:
    user: str
    password: str
    permissions: Mapping[str, Any] | None = None
    """nats-server permissions; None: everything (a control-plane service)."""


def node_user_name(node: str) -> str:
    return f"node-{subjects.encode_token(node)}"


def node_permissions(node: str) -> dict[str, Any]:
    """An agent publishes its node's reports, events and eviction requests, reads its own NodeSLO key, and receives
    the replies to its own requests (JetStream acks and the direct get's answer, on its inbox)."""
    return {
        "publish": {
            "allow": [
                subjects.node_prefix(node),
                f"$JS.API.DIRECT.GET.{streams.KV_KOORD_SLO}.{subjects.slo_key(node)}",
            ]
        },
        "subscribe": {"allow": ["_INBOX.>"]},
    }


def issue_node(node: str) -> NatsUser:
    return NatsUser(user=node_user_name(node), password=secrets.token_urlsafe(32), permissions=node_permissions(node))


def issue_service(name: str) -> NatsUser:
    return NatsUser(user=f"service-{subjects.encode_token(name)}", password=secrets.token_urlsafe(32))


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


def creds_json(user: NatsUser) -> str:
    return json.dumps({"user": user.user, "password": user.password}) + "\n"


def read_creds(text: str, *, source: str) -> tuple[str, str]:
    """(user, password) from a credentials file's text; ValueError naming `source` when it is not one."""
    try:
        document = json.loads(text)
        return str(document["user"]), str(document["password"])
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f'{source} is not a koordbus NATS credentials file ({{"user", "password"}}): {e}') from e
