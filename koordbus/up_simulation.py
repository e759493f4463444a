"""`koordbus up --simulate-nodes N`: the synthetic nodes (koordbus.simulation) and, without a real cluster, the
simulated cluster around them (koordbus.simcluster): its migration service's args, the API token it imports its
quotas with, and the two background tasks.

Called by koordbus.up.run_up; what the simulation runs is in docs/up.md#the-simulated-cluster.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

from agent.simulate import simulated_node_names
from bus.jetstream import JetStreamBus
from koordbus import extender, runtime, simulation
from koordbus.api import API_TOKEN_FILE
from koordbus.bridge import Bridge
from koordbus.simcluster import descheduling
from koordbus.simcluster.loop import Extender, SimCluster

log = logging.getLogger(__name__)

SIMULATION_MIGRATION_ARGS_FILE = "simulation-migration-args.yaml"
"""With --simulate-nodes and no cluster: the migration service's args (koordbus.simcluster.descheduling)."""


def migration_args(args: argparse.Namespace, data_dir: Path) -> str | None:
    """The MigrationControllerArgs file of the simulated cluster (load-aware descheduling on, jobs evicting
    directly; koordbus.simcluster.descheduling), written to the data dir; None without --simulate-nodes, with a
    cluster, or when KOORDBUS_MIGRATION_ARGS_FILE names one."""
    if not args.simulate_nodes or args.kubeconfig or os.environ.get("KOORDBUS_MIGRATION_ARGS_FILE"):
        return None
    path = data_dir / SIMULATION_MIGRATION_ARGS_FILE
    path.write_text(descheduling.MIGRATION_ARGS, encoding="utf-8")
    return str(path)


def start(
    stack: AsyncExitStack,
    bus: JetStreamBus,
    args: argparse.Namespace,
    *,
    cluster: Bridge,
    api_settings: Any,
    data_dir: Path,
    scheduler: extender.RunningExtender | None,
) -> None:
    """Run --simulate-nodes synthetic nodes on `bus`. Without a real cluster the simulation publishes its nodes, so the
    noderesource service decides their batch resources and the simulated batch pods follow them (with a real cluster
    it never would); and it runs the cluster around them (koordbus.simcluster): teams, their pods, hot nodes,
    migrations, its pods placed through the extender `scheduler` and its quotas imported through the API."""
    simulated_cluster = cluster.recorded_writes is not None
    names = simulated_node_names(args.simulate_nodes)
    loads = descheduling.node_loads(names) if simulated_cluster else None
    nodes = simulation.make_nodes(args.simulate_nodes, pods_per_node=args.simulate_pods, loads=loads)
    runtime.background(
        stack,
        simulation.run_simulation(
            bus,
            nodes,
            backfill_seconds=args.simulate_backfill,
            cluster=simulated_cluster,
            close_loop=simulated_cluster,
            qos=simulated_cluster,
        ),
        name="simulation",
        cancel_on_stop=True,
    )
    if not simulated_cluster:
        return
    sim_cluster = SimCluster(
        bus,
        nodes,
        api=f"http://{_loopback(api_settings.host)}:{api_settings.port}",
        token=api_token(api_settings, data_dir),
        running_since=time.time() - args.simulate_backfill,
        extender=None
        if scheduler is None
        else Extender(
            url=scheduler.url,
            ca=str(scheduler.tls.ca),
            cert=str(scheduler.tls.client_cert),
            key=str(scheduler.tls.client_key),
        ),
    )
    if cluster.recorded_verbs is not None:
        cluster.recorded_verbs.on_evict = sim_cluster.evicted
    runtime.background(stack, sim_cluster.run(), name="simulated-cluster", cancel_on_stop=True)


def api_token(settings: Any, data_dir: Path) -> str:
    """A token the simulated cluster calls the API with: `up`'s admin token, else the first admin or quota-admin
    token of the token file ("" with authentication off)."""
    if not settings.auth_enabled:
        return ""
    if not settings.api_tokens_file:
        return (data_dir / API_TOKEN_FILE).read_text().strip()
    for line in Path(settings.api_tokens_file).read_text().splitlines():
        fields = line.split()
        if len(fields) >= 2 and not line.lstrip().startswith("#") and fields[1] in ("admin", "quota-admin"):
            return fields[0]
    log.warning(
        "the simulated cluster finds no admin or quota-admin token in %s: it cannot import its quotas",
        settings.api_tokens_file,
    )
    return ""


def _loopback(host: str) -> str:
    """Where this process reaches its own API bound to `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host
