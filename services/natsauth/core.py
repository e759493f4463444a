"""Who a connecting agent is, from what Kubernetes said about its token: the decision of the NATS auth callout.

A TokenReview's `status.user` (or None when Kubernetes did not authenticate the token) is either the agent's
ServiceAccount with the node its pod runs on — a pod-bound token carries it as the user extra
`authentication.kubernetes.io/node-name` (Kubernetes ≥ 1.30) — or a refusal with its reason. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from schemas import names

NODE_NAME_EXTRA = "authentication.kubernetes.io/node-name"
POD_NAME_EXTRA = "authentication.kubernetes.io/pod-name"


@dataclass(frozen=True, kw_only=True)
class Allowed:
    node: str
    pod: str
    """The pod the token is bound to ("" when the token names none), for the log."""


@dataclass(frozen=True, kw_only=True)
class Refused:
    reason: str
    """Why, for the log and the server (which logs it with the client's address)."""
    kind: str
    """A short label for the refusals metric: no_token, not_authenticated, wrong_account, no_node (none, or not a
    node name)."""


Decision = Allowed | Refused


def service_account_user(service_account: str) -> str:
    """`namespace:name` (or a full `system:serviceaccount:…` username) → the username Kubernetes gives its tokens."""
    if service_account.startswith("system:serviceaccount:"):
        return service_account
    namespace, sep, name = service_account.partition(":")
    if not sep or not namespace or not name:
        raise ValueError(f"agent service account {service_account!r}: expected namespace:name")
    return f"system:serviceaccount:{namespace}:{name}"


def _single(extra: Mapping[str, Any], key: str) -> str:
    values = extra.get(key)
    if isinstance(values, list) and len(values) == 1 and isinstance(values[0], str):
        return values[0]
    return ""


def decide(token: str, reviewed_user: Mapping[str, Any] | None, *, agent_user: str) -> Decision:
    """Allowed(node) when `reviewed_user` is `agent_user` (a ServiceAccount's username) with exactly one node name;
    else Refused with the reason."""
    if not token:
        return Refused(reason="no token: agents connect with their ServiceAccount token", kind="no_token")
    if reviewed_user is None:
        return Refused(reason="Kubernetes did not authenticate the token", kind="not_authenticated")
    username = str(reviewed_user.get("username", ""))
    if username != agent_user:
        return Refused(reason=f"{username or 'the token'} is not the agent's service account {agent_user}",
                       kind="wrong_account")  # fmt: skip
    extra = reviewed_user.get("extra")
    extra = extra if isinstance(extra, Mapping) else {}
    node = _single(extra, NODE_NAME_EXTRA)
    if not node:
        return Refused(
            reason=f"the token of {username} names no node ({NODE_NAME_EXTRA}): mount a projected, pod-bound "
            "ServiceAccount token (Kubernetes 1.30 or later)",
            kind="no_node",
        )
    try:
        names.node_name(node, NODE_NAME_EXTRA)
    except names.InvalidName as e:  # it becomes the user's subjects: never one nats-server cannot carry
        return Refused(reason=f"the token of {username}: {e}", kind="no_node")
    return Allowed(node=node, pod=_single(extra, POD_NAME_EXTRA))
