"""What `koordbus up` prints once it is up: where the dashboard, API, NATS, database and extender are, with which
credentials, what the simulation runs and what `up` leaves out.

Called by koordbus.up.run_up with what it started; the README and docs/up.md show an excerpt, which should match.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from agent.simulate import simulated_node_names
from bus import streams
from bus.cluster import LocalNatsCluster
from koordbus import extender, natsauth
from koordbus.api import API_TOKEN_FILE
from koordbus.common import local_node_name
from koordbus.simcluster import descheduling, teams
from koordbus.up_bus import UpNats
from koordbus.up_simulation import SIMULATION_MIGRATION_ARGS_FILE


def banner(
    args: argparse.Namespace,
    *,
    api_settings: Any,
    data_dir: Path,
    nats: UpNats,
    database_url: str,
    caps: streams.SizeCaps,
    cluster_line: str,
    simulated_cluster: bool,
    scheduler: extender.RunningExtender | None,
    executor: bool,
    report_interval: float,
) -> str:
    """The banner: `cluster_line` is the Kubernetes bridge's, `simulated_cluster` whether --simulate-nodes runs a
    cluster around its nodes, `executor` whether the migration executor runs, `report_interval` the nodemetric
    service's."""
    base = f"http://{api_settings.host}:{api_settings.port}"
    tokens_where = (
        api_settings.api_tokens_file
        if api_settings.api_tokens_file
        else f"{data_dir / API_TOKEN_FILE} (role admin)"
        if api_settings.auth_enabled
        else "NONE: authentication disabled"
    )
    generated = not api_settings.api_tokens_file and api_settings.auth_enabled
    try_node = simulated_node_names(1)[0] if args.simulate_nodes else local_node_name()
    # the token rides in the URL fragment, which a browser never sends to the server (nor to its logs)
    sign_in = f"{base}/#token={(data_dir / API_TOKEN_FILE).read_text().strip()}" if generated else f"{base}/"
    return (
        f"koordbus is up.\n"
        f"  dashboard   {sign_in}\n"
        f"              (events: {base}/api/v1/events/stream)\n"
        f"  API         {base}/api/v1/nodemetrics   (docs: {base}/docs, metrics: {base}/metrics)\n"
        f"  NATS        {nats.url}   (credentials: {nats.creds or 'none'})\n"
        f"{_identities_banner(data_dir, nats.identities)}"
        f"{'' if nats.cluster is None else _cluster_banner(nats.cluster, replicas=nats.replicas)}"
        f"  database    {database_url}\n"
        f"  data dir    {data_dir}   (streams capped: {_caps_banner(caps)})\n"
        f"  API token   {tokens_where}\n"
        f"  agent       {'off' if args.no_agent else local_node_name()}"
        f"   simulated nodes: {args.simulate_nodes}\n"
        f"{_simulation_banner(args, data_dir, simulated_cluster=simulated_cluster)}"
        f"  cluster     {cluster_line}\n"
        f"{_extender_banner(scheduler, node=try_node)}"
        f"  not running {_not_running(executor=executor)}\n"
        f"NodeMetrics appear after the first report interval ({report_interval} s of samples)."
        f" Ctrl-C stops."
    )


def _identities_banner(data_dir: Path, identities: dict[str, Path]) -> str:
    if not identities:
        return ""
    agent = natsauth.UP_AGENT
    only = f", the agent's only its node's subjects ({agent}.creds.json)" if agent in identities else ""
    where = data_dir / natsauth.UP_USERS_DIR
    return f"              (each service its own NATS user, as in the Helm chart{only}: {where})\n"


def _simulation_banner(args: argparse.Namespace, data_dir: Path, *, simulated_cluster: bool) -> str:
    """What the simulated cluster runs, for the banner (nothing without --simulate-nodes)."""
    if not args.simulate_nodes:
        return ""
    if not simulated_cluster:
        return "  simulation  nodes only: the cluster is a real one (its pods, quotas and migrations are its own)\n"
    args_file = os.environ.get("KOORDBUS_MIGRATION_ARGS_FILE") or data_dir / SIMULATION_MIGRATION_ARGS_FILE
    count = descheduling.hot_count(args.simulate_nodes)
    hot = f"{count} hot nodes" if count else f"no hot node (fewer than {descheduling.MIN_NODES_WITH_HOT} nodes)"
    names = ", ".join(t.name for t in teams.TEAMS)
    return (
        "  simulation  a cluster around the nodes (docs/up.md#the-simulated-cluster):\n"
        f"              quota tree {teams.PARENT} of teams {names}, their pods placed\n"
        "              through the extender's filter/prioritize/bind and finished over time (Quotas page);\n"
        f"              {hot}, load-aware descheduling on ({args_file}),\n"
        "              migrations carried out on the simulated cluster (Migrations page);\n"
        "              the nodes' cpu-suppress, be-cgroup and eviction loops in dry-run (Node pages)\n"
    )


def _cluster_banner(cluster: LocalNatsCluster, *, replicas: int) -> str:
    """The NATS cluster's banner lines: its members, where each says how JetStream stands, and how to see a leader
    lost and elected again."""
    monitors = ", ".join(f"http://127.0.0.1:{p.monitor}/jsz" for p in cluster.ports)
    return (
        f"              ({cluster.size} clustered nats-servers, streams at R{replicas}, routes authenticated;"
        f" stores and logs in {cluster.data_dir})\n"
        f"              (JetStream as each member sees it: {monitors})\n"
    )


def _extender_banner(running: extender.RunningExtender | None, *, node: str) -> str:
    """The extender's banner lines: where it answers, its credentials, and a request to try."""
    if running is None:
        return "  extender    off (--no-extender): `koordbus scheduler explain` has nothing to ask\n"
    tls = running.tls
    return (
        f"  extender    {running.url}   (the load-aware kube-scheduler extender: filter, prioritize, bind, explain)\n"
        f"              (mutual TLS: CA {tls.ca}, client certificate and key {tls.client_cert.name},"
        f" {tls.client_key.name} next to it)\n"
        f"              try: {extender.try_it(running, node=node)}\n"
    )


def _not_running(*, executor: bool) -> str:
    """What `up` leaves out, for the banner."""
    parts = [
        "the admission webhook (`koordbus service webhook` answers a kube-apiserver's AdmissionReviews; with no "
        "cluster there is none to call it: see docs/webhook.md)",
        "the NATS auth callout (natsauth, for agents signing in with ServiceAccount tokens: `up`'s agent is a user "
        "of the server's with the permissions the callout would grant it)",
    ]
    if not executor:
        parts.append("the migration executor (no cluster: passed migration jobs are arbitrated, not carried out)")
    return ";\n              ".join(parts)


def _caps_banner(caps: streams.SizeCaps) -> str:
    """`KOORD_NODE 1536 MiB, …` for the banner (a stream without a cap is left out)."""
    named = ((streams.KOORD_NODE, caps.node), (streams.KOORD_NODEMETRIC, caps.nodemetric),
             (streams.KOORD_NODERESOURCE, caps.noderesource))  # fmt: skip
    return ", ".join(f"{name} {size / 2**20:g} MiB" for name, size in named if size is not None and size > 0) or "none"
