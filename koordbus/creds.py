"""`koordbus creds`: NATS users' credentials files and the server's users entry, and the cluster's Secret of NATS
identities (koordbus.natsauth)."""

from __future__ import annotations

import argparse
import asyncio
import os
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    creds = sub.add_parser(
        "creds",
        help="NATS users: credentials for a node's agent or a control-plane service, and the server's users entry",
        description="issue-node NODE: a user that may publish only koord.v1.node.<NODE>.> and read only NODE's NodeSLO "
        "key. issue-service NAME: a user for a control-plane process (everything). Writes the credentials file "
        "(--out, mode 0600; give it to the process as --nats-creds / KOORDBUS_NATS_CREDS, e.g. from a Secret) and "
        "prints the matching entry for the nats-server `authorization { users = [...] }` block. "
        "ensure-cluster-secret SECRET: create the Secret of a cluster's NATS identities (the auth callout's account "
        "key, a password and credentials file per service) or add what it lacks, changing nothing there (the Helm "
        "chart's hook Job runs it; needs a cluster). ensure-compose DIR: the same for docker-compose.yml, as files in "
        "DIR/nats (a credentials file per service and for the agent of --node, and the server's users in auth.conf), "
        "keeping those already there (`make compose-creds` runs it).",
    )
    actions = ["issue-node", "issue-service", "ensure-cluster-secret", "ensure-compose"]
    creds.add_argument("action", choices=actions, help="what to issue")
    creds.add_argument(
        "name", help="the node's Kubernetes name, the service's name, the Secret's name, or the compose directory"
    )
    creds.add_argument("--node", default="compose-node", help="ensure-compose: the agent's node (compose-node)")
    creds.add_argument("--out", default=None, help="credentials file to write (default: <user>.creds.json)")
    creds.add_argument("--namespace", default="default", help="ensure-cluster-secret: the Secret's namespace")
    creds.add_argument(
        "--services",
        default=None,
        help="ensure-cluster-secret: comma-separated service users (default: every control-plane service)",
    )
    creds.add_argument("--kubeconfig", default=None, help="ensure-cluster-secret: the cluster (default: in-cluster)")
    creds.set_defaults(run=run_creds)


def run_creds(args: argparse.Namespace) -> int:
    from bus import auth

    if args.action in ("ensure-cluster-secret", "ensure-compose"):
        from koordbus import natsauth

        if args.action == "ensure-compose":
            return natsauth.run_ensure_compose(args)
        return asyncio.run(natsauth.run_ensure_cluster_secret(args))

    try:
        user = auth.issue_node(args.name) if args.action == "issue-node" else auth.issue_service(args.name)
    except ValueError as e:
        raise SystemExit(f"koordbus creds: {e}") from None
    out = Path(args.out or f"{user.user}.creds.json")
    if out.exists():
        raise SystemExit(f"koordbus creds: {out} exists; not overwriting credentials (remove it or pass --out)")
    descriptor = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as f:
        f.write(auth.creds_json(user))
    print(f"# credentials for {user.user} written to {out}; add this user to the nats-server configuration:")
    print(auth.render_authorization([user]), end="")
    return 0
