"""`koordbus up`: everything in one process (embedded NATS, SQLite, the services, a local agent, the API).

It parses its flags into typed settings at the edge and starts the parts in order: the NATS side (koordbus.up_bus),
the database, the services, the Kubernetes bridge, the extender, the API, the agent and, with --simulate-nodes, the
simulation (koordbus.up_simulation); then it prints where everything is (koordbus.up_banner) and runs until Ctrl-C /
SIGTERM, when it shuts down in reverse order (koordbus.runtime). Called by koordbus.cli.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Any

from koordbus import arg_types, extender, natsauth
from koordbus.api import api_tokens, event_hub
from koordbus.bridge import bridge_cluster
from koordbus.common import add_common, common_settings, local_node_name, routes_of, watermark_defaults
from koordbus.parts import migration_settings, start_migration, start_migration_executor
from koordbus.settings import EmbeddedStreamSettings
from services.common import settings as settings_loader

if TYPE_CHECKING:
    from bus.jetstream import JetStreamBus
    from koordbus.bridge import Bridge

# The heavy parts (nats, sqlalchemy, fastapi, numpy) are imported by the subcommand that runs, so `koordbus calc`
# and `--help` start fast.

log = logging.getLogger(__name__)


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
    up.add_argument("--port", type=arg_types.port, default=8080, help="API port (default 8080)")
    up.add_argument(
        "--api-tokens-file",
        default=None,
        help="API token file ('token role [name]' per line; default: an admin token generated in the data dir)",
    )
    up.add_argument(
        "--extender-port",
        type=arg_types.port,
        default=None,
        metavar="PORT",
        help="the load-aware kube-scheduler extender's port on --host, over mutual TLS with credentials in the data "
        f"dir (default {extender.DEFAULT_PORT}, or a free port when that one is taken; 0: a free port)",
    )
    up.add_argument("--no-extender", action="store_true", help="do not run the load-aware scheduler extender")
    up.add_argument(
        "--simulate-nodes",
        type=arg_types.integer(0, 100_000),
        default=0,
        metavar="N",
        help="also run N synthetic nodes",
    )
    up.add_argument(
        "--simulate-pods",
        type=arg_types.integer(1, 1_000),
        default=20,
        metavar="P",
        help="pods per synthetic node (default 20)",
    )
    up.add_argument(
        "--simulate-backfill",
        type=arg_types.number(0, 86_400),
        default=1800.0,
        metavar="SECONDS",
        help="history the synthetic nodes publish at start, so percentiles show at once (default 1800)",
    )
    up.add_argument("--no-agent", action="store_true", help="do not run an agent for this host")
    up.add_argument(
        "--nats-cluster",
        type=arg_types.integer(0, 15),
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
    up.set_defaults(run=_run)


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


def _run(args: argparse.Namespace) -> int:
    from koordbus import runtime

    return runtime.run_command(run_up(args))


async def run_up(args: argparse.Namespace) -> int:
    from koordbus import http_serve, runtime, up_banner, up_bus, up_simulation
    from services.api.settings import ApiSettings
    from services.common.metrics import new_registry
    from services.nodemetric import component as nodemetric_component
    from services.nodemetric.settings import NodeMetricSettings
    from services.noderesource import component as noderesource_component
    from services.noderesource.settings import NodeResourceSettings
    from services.quota import component as quota_component
    from services.quota.settings import QuotaSettings
    from services.slo.service import SloService

    common = common_settings(args)
    stream_caps = settings_loader.load(EmbeddedStreamSettings).caps()
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    os.umask(0o077)  # the database, its -wal/-shm, the NATS store and logs: this user's only
    data_dir = prepare_data_dir(common.data_dir)
    api_settings = settings_loader.load(
        ApiSettings, {"host": args.host, "port": args.port, "api_tokens_file": args.api_tokens_file}
    )
    tokens = api_tokens(api_settings, command="up", data_dir=data_dir)
    nm_settings = settings_loader.load(NodeMetricSettings)
    registry = new_registry()
    async with AsyncExitStack() as stack:
        # Both ports bound now and held until served: nothing else takes them while the other parts start.
        api_socket = http_serve.reserve(args.host, args.port)
        if api_socket is None:
            raise SystemExit(f"koordbus up: port {args.port} on {args.host} is in use; pass --port")
        stack.enter_context(api_socket)
        extender_socket = None
        if not args.no_extender:
            extender_socket = stack.enter_context(extender.reserve_port(args.host, args.extender_port))
        else:  # `koordbus scheduler explain` must not find an extender this `up` does not run
            (data_dir / extender.URL_FILE).unlink(missing_ok=True)
        stop = runtime.stop_event_on_signals(stack)
        nats = await up_bus.start_nats(
            stack,
            common,
            data_dir,
            cluster_size=args.nats_cluster,
            agent_node=None if args.no_agent else local_node_name(),
        )
        database_url = common.database_url or f"sqlite:///{data_dir / 'koordbus.db'}"
        buses = await up_bus.open_buses(stack, nats, registry=registry, caps=stream_caps)
        engine = await runtime.open_database(stack, database_url, migrate=True)
        nodemetric = await nodemetric_component.build(
            stack,
            bus=await buses.of("nodemetric"),
            engine=engine,
            registry=registry,
            settings=nm_settings,
            route_settings=routes_of(api_settings),
        )
        noderesource = await noderesource_component.build(
            stack,
            bus=await buses.of("noderesource"),
            engine=engine,
            registry=registry,
            settings=settings_loader.load(NodeResourceSettings),
        )
        slo = SloService(await buses.of("slo"), registry=registry)
        await slo.start()
        stack.push_async_callback(slo.stop)
        quota = await quota_component.build(
            stack,
            bus=await buses.of("quota"),
            engine=engine,
            registry=registry,
            settings=settings_loader.load(QuotaSettings),
        )
        migration = migration_settings(up_simulation.migration_args(args, data_dir))
        migration_bus = await buses.of("migration")
        migration_service = await start_migration(stack, migration_bus, registry, migration, engine=engine)
        cluster = await bridge_cluster(
            stack,
            await buses.of("k8s"),
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
        if extender_socket is not None:
            scheduler = await extender.start(
                stack,
                await buses.of("loadaware"),
                registry,
                data_dir=data_dir,
                host=args.host,
                reserved=extender_socket,
                now=time.time(),
            )
        api_bus = await buses.of("api")
        hub = await event_hub(stack, api_bus, api_settings)
        app = _api_app(
            api_settings,
            api_bus,
            components=(nodemetric, noderesource, quota),
            migration_store=migration_service.store,
            cluster=cluster,
            engine=engine,
            hub=hub,
            registry=registry,
            tokens=tokens,
            liveness=buses.liveness(),
        )
        await http_serve.serve_http(
            stack,
            app,
            host=api_settings.host,
            port=api_settings.port,
            end_streams=hub.end_streams,
            reserved=api_socket,
        )
        if not args.no_agent:
            _start_agent(stack, await buses.of(natsauth.UP_AGENT))
        if args.simulate_nodes:
            up_simulation.start(
                stack,
                buses.bus,
                args,
                cluster=cluster,
                api_settings=api_settings,
                data_dir=data_dir,
                scheduler=scheduler,
            )
        text = up_banner.banner(
            args,
            api_settings=api_settings,
            data_dir=data_dir,
            nats=nats,
            database_url=database_url,
            caps=stream_caps,
            cluster_line=cluster.banner,
            simulated_cluster=bool(args.simulate_nodes) and cluster.recorded_writes is not None,
            scheduler=scheduler,
            executor=executor_runs,
            report_interval=nm_settings.report_interval_seconds,
        )
        print(text, flush=True)
        await stop.wait()
        print("koordbus: shutting down …", flush=True)
    return 0


def _api_app(
    settings: Any,
    bus: JetStreamBus,
    *,
    components: tuple[Any, ...],
    migration_store: Any,
    cluster: Bridge,
    engine: Any,
    hub: Any,
    registry: Any,
    tokens: Any,
    liveness: Callable[[], str | None],
) -> Any:
    """The API app over the services' `components`, with the routes of the parts that run elsewhere asked over `bus`
    (migrations, the extender's queries, NodeSLOs, colocation profiles) and the bridge's recorded writes."""
    from services.api.app import ApiContext, create_app
    from services.common import observe
    from services.common.watermark_feed import WatermarkReader
    from services.k8s import component as k8s_component
    from services.loadaware import component as loadaware_component
    from services.loadaware.client import LoadAwareClient
    from services.migration import component as migration_component
    from services.migration.client import MigrationClient
    from services.slo import component as slo_component
    from services.webhook import component as webhook_component

    return create_app(
        ApiContext(
            settings=settings,
            components=(
                *components,
                migration_component.routes_over(migration_store, MigrationClient(bus)),
                k8s_component.recorded_writes(cluster.recorded_writes),
                loadaware_component.queries(LoadAwareClient(bus)),
                slo_component.reads(bus),
                webhook_component.profiles(bus),
            ),
            watermark_reader=WatermarkReader(bus),
            watermark_defaults=watermark_defaults(),
            event_hub=hub,
            registry=registry,
            tokens=tokens,
            readiness=(
                ("database", observe.database_ready(engine)),
                ("bus", observe.bus_ready(bus)),
                *cluster.readiness,
            ),
            liveness=(("bus", liveness),),
        )
    )


def _start_agent(stack: AsyncExitStack, bus: JetStreamBus) -> None:
    """The agent of this host on `bus` (its node's NATS user), with its topology reporter unless that is off."""
    from agent.service import AgentService
    from agent.settings import AgentSettings, QosSettings
    from agent.topology_watch import reporter_for
    from koordbus import runtime

    settings = settings_loader.load(AgentSettings, {"node_name": local_node_name()})
    agent = AgentService(settings, bus)
    runtime.background(stack, agent.run(), name="agent")
    if settings.topology_report:
        reserved = settings_loader.load(QosSettings).reserved_cpus
        reporter = reporter_for(settings, bus, reserved_cpus=reserved)
        runtime.background(stack, reporter.run(), name="topology")
