"""`koordbus up`: everything in one process (embedded NATS, SQLite, the services, a local agent, the API).

It parses its flags into typed settings at the edge, builds the parts with koordbus.runtime,
and runs until Ctrl-C / SIGTERM, then shuts down in reverse order.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus import streams
from koordbus import extender, natsauth
from koordbus.api import API_TOKEN_FILE, api_tokens, event_hub
from koordbus.bridge import bridge_cluster
from koordbus.common import add_common, common_settings, local_node_name, routes_of, watermark_defaults
from koordbus.parts import migration_settings, start_migration, start_migration_executor
from koordbus.settings import EmbeddedStreamSettings
from services.common import settings as settings_loader

if TYPE_CHECKING:
    from bus.cluster import LocalNatsCluster
    from bus.jetstream import JetStreamBus

# The heavy parts (nats, sqlalchemy, fastapi, numpy) are imported by the subcommand that runs, so `koordbus calc`
# and `--help` start fast.

log = logging.getLogger(__name__)


SIMULATION_MIGRATION_ARGS_FILE = "simulation-migration-args.yaml"
"""With --simulate-nodes and no cluster: the migration service's args (koordbus.simcluster.descheduling)."""
CLUSTER_STREAM_REPLICAS = 3
"""Stream replicas with --nats-cluster (fewer when the cluster is smaller), as the chart's streamReplicas."""
NATS_CREDS_FILE = "nats-creds.json"
"""`koordbus up` with its embedded nats-server: the credentials of its own NATS user (everything allowed), which sets
up the streams and runs the simulation (generated on first start, mode 0600; pass it as --nats-creds to join another
process)."""


def add_parser(sub: Any) -> None:
    up = sub.add_parser(
        "up",
        help="run everything on this machine: embedded NATS, SQLite, services, a local agent and the API",
        description="Start the embedded default: nats-server from the wheel (JetStream, data in --data-dir), SQLite "
        "in the same directory, the nodemetric, noderesource, slo, quota and migration services, the load-aware "
        "scheduler extender (mutual TLS on --extender-port), the Kubernetes bridge, an agent for this host and the "
        "API. Ctrl-C stops it.",
    )
    add_common(up, embedded=True)
    up.add_argument("--data-dir", help="where the NATS store, logs and SQLite live (default .koordbus)")
    up.add_argument("--host", default="127.0.0.1", help="API bind address (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=8080, help="API port (default 8080)")
    up.add_argument(
        "--api-tokens-file",
        default=None,
        help="API token file ('token role [name]' per line; default: an admin token generated in the data dir)",
    )
    up.add_argument(
        "--extender-port",
        type=int,
        default=None,
        metavar="PORT",
        help="the load-aware kube-scheduler extender's port on --host, over mutual TLS with credentials in the data "
        f"dir (default {extender.DEFAULT_PORT}, or a free port when that one is taken; 0: a free port)",
    )
    up.add_argument("--no-extender", action="store_true", help="do not run the load-aware scheduler extender")
    up.add_argument("--simulate-nodes", type=int, default=0, metavar="N", help="also run N synthetic nodes")
    up.add_argument("--simulate-pods", type=int, default=20, metavar="P", help="pods per synthetic node (default 20)")
    up.add_argument(
        "--simulate-backfill",
        type=float,
        default=1800.0,
        metavar="SECONDS",
        help="history the synthetic nodes publish at start, so percentiles show at once (default 1800)",
    )
    up.add_argument("--no-agent", action="store_true", help="do not run an agent for this host")
    up.add_argument(
        "--nats-cluster",
        type=int,
        default=0,
        metavar="N",
        help="run N clustered nats-servers on loopback instead of one (authenticated routes, a store each, streams "
        "replicated on up to 3 of them): the distributed setup of the Helm chart on one machine (a dev option)",
    )
    up.add_argument(
        "--kubeconfig",
        default=None,
        help="watch this cluster's Nodes, Pods and colocation ConfigMap (default: no cluster; or KOORDBUS_KUBECONFIG)",
    )
    up.add_argument(
        "--dry-run",
        action="store_true",
        help="with --kubeconfig: decide but write nothing to the cluster (see /api/v1/k8s/recorded-writes)",
    )
    up.set_defaults(run=lambda a: asyncio.run(run_up(a)))


def prepare_data_dir(path: str) -> Path:
    """The data dir, readable by this user only: mode 0700, and no group or other bits on anything inside (a data
    dir from an older version included). The caller sets umask 077 so what is written later is private too."""
    data_dir = Path(path).resolve()
    data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    data_dir.chmod(0o700)
    for root, dirs, files in os.walk(data_dir):
        for name in (*dirs, *files):
            entry = Path(root) / name
            try:
                if not entry.is_symlink():
                    entry.chmod(entry.stat().st_mode & 0o7700)
            except OSError as e:  # another user's file: say so, the start goes on
                log.warning("cannot make %s private: %s", entry, e)
    return data_dir


async def run_up(args: argparse.Namespace) -> int:
    from agent.service import AgentService
    from agent.settings import AgentSettings, QosSettings
    from agent.simulate import simulated_node_names
    from agent.topology_watch import reporter_for
    from koordbus import runtime, simulation
    from koordbus.simcluster import descheduling
    from koordbus.simcluster.loop import Extender, SimCluster
    from services.api.app import ApiContext, create_app
    from services.api.settings import ApiSettings
    from services.common import observe
    from services.common.metrics import new_registry
    from services.common.watermark_feed import WatermarkReader
    from services.k8s import component as k8s_component
    from services.loadaware import component as loadaware_component
    from services.loadaware.client import LoadAwareClient
    from services.migration import component as migration_component
    from services.migration.client import MigrationClient
    from services.nodemetric import component as nodemetric_component
    from services.nodemetric.settings import NodeMetricSettings
    from services.noderesource import component as noderesource_component
    from services.noderesource.settings import NodeResourceSettings
    from services.quota import component as quota_component
    from services.quota.settings import QuotaSettings
    from services.slo import component as slo_component
    from services.slo.service import SloService
    from services.webhook import component as webhook_component

    common = common_settings(args)
    stream_caps = settings_loader.load(EmbeddedStreamSettings).caps()
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    os.umask(0o077)  # the database, its -wal/-shm, the NATS store and logs: this user's only
    data_dir = prepare_data_dir(common.data_dir)
    if not runtime.port_is_free(args.host, args.port):
        raise SystemExit(f"koordbus up: port {args.port} on {args.host} is in use; pass --port")
    extender_port = None if args.no_extender else extender.pick_port(args.host, args.extender_port)
    if extender_port is None:  # `koordbus scheduler explain` must not find an extender this `up` does not run
        (data_dir / extender.URL_FILE).unlink(missing_ok=True)
    api_settings = settings_loader.load(
        ApiSettings, {"host": args.host, "port": args.port, "api_tokens_file": args.api_tokens_file}
    )
    tokens = api_tokens(api_settings, command="up", data_dir=data_dir)
    nm_settings = settings_loader.load(NodeMetricSettings)
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        creds = common.nats_creds
        replicas = common.stream_replicas
        nats_banner = ""
        identities: dict[str, Path] = {}
        if common.nats_url:
            nats_url = common.nats_url
        else:  # no anonymous access, even on loopback: other local users must not read or write the streams
            creds = str(data_dir / NATS_CREDS_FILE)
            identities, authorization = natsauth.up_identities(
                data_dir, creds=Path(creds), node=None if args.no_agent else local_node_name()
            )
            if args.nats_cluster > 1:
                nats_cluster = await runtime.open_embedded_nats_cluster(
                    stack, data_dir, size=args.nats_cluster, authorization=authorization
                )
                nats_url = nats_cluster.url
                replicas = min(args.nats_cluster, CLUSTER_STREAM_REPLICAS)
                nats_banner = _cluster_banner(nats_cluster, replicas=replicas)
            else:
                nats_url = await runtime.open_embedded_nats(stack, data_dir, authorization=authorization)
        database_url = common.database_url or f"sqlite:///{data_dir / 'koordbus.db'}"
        bus = await runtime.open_bus(
            stack, nats_url, name="koordbus-up", creds=creds, caps=stream_caps, replicas=replicas
        )
        observe.watch_bus(registry, bus)
        buses = {"up": bus}

        async def bus_for(part: str) -> JetStreamBus:
            """The bus of `part`: with the embedded nats-server its own connection as its own NATS user (the chart's
            pod of its own), else the one bus."""
            if part not in identities:
                return bus
            buses[part] = await runtime.open_bus(
                stack, nats_url, name=f"koordbus-up-{part}", creds=str(identities[part]), ensure_streams=False
            )
            observe.watch_bus(registry, buses[part])
            return buses[part]

        engine = await runtime.open_database(stack, database_url, migrate=True)
        route_settings = routes_of(api_settings)
        nodemetric = await nodemetric_component.build(
            stack,
            bus=await bus_for("nodemetric"),
            engine=engine,
            registry=registry,
            settings=nm_settings,
            route_settings=route_settings,
        )
        noderesource = await noderesource_component.build(
            stack,
            bus=await bus_for("noderesource"),
            engine=engine,
            registry=registry,
            settings=settings_loader.load(NodeResourceSettings),
        )
        slo = SloService(await bus_for("slo"), registry=registry)
        await slo.start()
        stack.push_async_callback(slo.stop)
        quota = await quota_component.build(
            stack,
            bus=await bus_for("quota"),
            engine=engine,
            registry=registry,
            settings=settings_loader.load(QuotaSettings),
        )
        migration = migration_settings(_simulation_migration_args(args, data_dir))
        migration_bus = await bus_for("migration")
        migration_service = await start_migration(stack, migration_bus, registry, migration, engine=engine)
        cluster = await bridge_cluster(
            stack,
            await bus_for("k8s"),
            registry,
            kubeconfig=args.kubeconfig,
            record_only_without_config=True,
            dry_run=args.dry_run,
            record_verbs=bool(args.simulate_nodes),
        )
        # with a cluster, or the simulated one (whose cluster carries out the recorded evictions): jobs are carried out
        executor_runs = cluster.recorded_writes is None or cluster.recorded_verbs is not None
        if executor_runs:
            await start_migration_executor(stack, migration_bus, registry, migration)
        scheduler = None
        if extender_port is not None:
            scheduler = await extender.start(
                stack,
                await bus_for("loadaware"),
                registry,
                data_dir=data_dir,
                host=args.host,
                port=extender_port,
                now=time.time(),
            )
        api_bus = await bus_for("api")
        hub = await event_hub(stack, api_bus, api_settings)
        app = create_app(
            ApiContext(
                settings=api_settings,
                components=(
                    nodemetric,
                    noderesource,
                    quota,
                    migration_component.routes_over(migration_service.store, MigrationClient(api_bus)),
                    k8s_component.recorded_writes(cluster.recorded_writes),
                    loadaware_component.queries(LoadAwareClient(api_bus)),
                    slo_component.reads(api_bus),
                    webhook_component.profiles(api_bus),
                ),
                watermark_reader=WatermarkReader(api_bus),
                watermark_defaults=watermark_defaults(),
                event_hub=hub,
                registry=registry,
                tokens=tokens,
                readiness=(
                    ("database", observe.database_ready(engine)),
                    ("bus", observe.bus_ready(api_bus)),
                    *cluster.readiness,
                ),
                liveness=(("bus", _buses_liveness(buses)),),
            )
        )
        await runtime.serve_http(
            stack, app, host=api_settings.host, port=api_settings.port, end_streams=hub.end_streams
        )
        if not args.no_agent:
            agent_settings = settings_loader.load(AgentSettings, {"node_name": local_node_name()})
            agent_bus = await bus_for(natsauth.UP_AGENT)
            agent = AgentService(agent_settings, agent_bus)
            runtime.background(stack, agent.run(), name="agent")
            if agent_settings.topology_report:
                reserved = settings_loader.load(QosSettings).reserved_cpus
                reporter = reporter_for(agent_settings, agent_bus, reserved_cpus=reserved)
                runtime.background(stack, reporter.run(), name="topology")
        if args.simulate_nodes:
            # Without a real cluster the simulation publishes its nodes, so the noderesource service decides their
            # batch resources and the simulated batch pods follow them (with a real cluster it never would); and
            # it runs the cluster around them (koordbus.simcluster): teams, their pods, hot nodes, migrations.
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
            if simulated_cluster:
                sim_cluster = SimCluster(
                    bus,
                    nodes,
                    api=f"http://{_loopback(api_settings.host)}:{api_settings.port}",
                    token=_simulation_token(api_settings, data_dir),
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
        simulated = bool(args.simulate_nodes) and cluster.recorded_writes is not None
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
        print(
            f"koordbus is up.\n"
            f"  dashboard   {sign_in}\n"
            f"              (events: {base}/api/v1/events/stream)\n"
            f"  API         {base}/api/v1/nodemetrics   (docs: {base}/docs, metrics: {base}/metrics)\n"
            f"  NATS        {nats_url}   (credentials: {creds or 'none'})\n"
            f"{_identities_banner(data_dir, identities)}"
            f"{nats_banner}"
            f"  database    {database_url}\n"
            f"  data dir    {data_dir}   (streams capped: {_caps_banner(stream_caps)})\n"
            f"  API token   {tokens_where}\n"
            f"  agent       {'off' if args.no_agent else local_node_name()}"
            f"   simulated nodes: {args.simulate_nodes}\n"
            f"{_simulation_banner(args, data_dir, simulated_cluster=simulated)}"
            f"  cluster     {cluster.banner}\n"
            f"{_extender_banner(scheduler, node=try_node)}"
            f"  not running {_not_running(executor=executor_runs)}\n"
            f"NodeMetrics appear after the first report interval ({nm_settings.report_interval_seconds} s of samples)."
            f" Ctrl-C stops.",
            flush=True,
        )
        await stop.wait()
        print("koordbus: shutting down …", flush=True)
    return 0


def _buses_liveness(buses: dict[str, JetStreamBus]) -> Callable[[], str | None]:
    """/healthz's bus check over every connection of the process (koordbus.runtime.bus_liveness), naming the part."""
    from koordbus import runtime

    checks = {part: runtime.bus_liveness(bus) for part, bus in buses.items()}

    def check() -> str | None:
        for part, one in checks.items():
            if (reason := one()) is not None:
                return reason if len(checks) == 1 else f"{part}: {reason}"
        return None

    return check


def _identities_banner(data_dir: Path, identities: dict[str, Path]) -> str:
    if not identities:
        return ""
    agent = natsauth.UP_AGENT
    only = f", the agent's only its node's subjects ({agent}.creds.json)" if agent in identities else ""
    where = data_dir / natsauth.UP_USERS_DIR
    return f"              (each service its own NATS user, as in the Helm chart{only}: {where})\n"


def _simulation_migration_args(args: argparse.Namespace, data_dir: Path) -> str | None:
    """The MigrationControllerArgs file of the simulated cluster (load-aware descheduling on, jobs evicting
    directly; koordbus.simcluster.descheduling), written to the data dir; None without --simulate-nodes, with a
    cluster, or when KOORDBUS_MIGRATION_ARGS_FILE names one."""
    from koordbus.simcluster import descheduling

    if not args.simulate_nodes or args.kubeconfig or os.environ.get("KOORDBUS_MIGRATION_ARGS_FILE"):
        return None
    path = data_dir / SIMULATION_MIGRATION_ARGS_FILE
    path.write_text(descheduling.MIGRATION_ARGS, encoding="utf-8")
    return str(path)


def _simulation_token(settings: Any, data_dir: Path) -> str:
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
    log.warning("the simulated cluster finds no admin or quota-admin token in %s: it cannot import its quotas")
    return ""


def _loopback(host: str) -> str:
    """Where this process reaches its own API bound to `host`."""
    return "127.0.0.1" if host in ("0.0.0.0", "", "::") else host


def _simulation_banner(args: argparse.Namespace, data_dir: Path, *, simulated_cluster: bool) -> str:
    """What the simulated cluster runs, for the banner (nothing without --simulate-nodes)."""
    from koordbus.simcluster import descheduling, teams

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
