"""`koordbus service <name>`: one control-plane service against an existing NATS (and database).

It parses its flags into typed settings at the edge, builds the parts with koordbus.runtime,
and runs until Ctrl-C / SIGTERM, then shuts down in reverse order.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
from contextlib import AsyncExitStack
from typing import Any

from koordbus.bridge import bridge_cluster
from koordbus.common import add_common, common_settings, open_cluster_bus, require, serve_service_port
from koordbus.parts import loadaware_args, migration_settings, start_migration, start_quota
from services.common import settings as settings_loader

# The heavy parts (nats, sqlalchemy, fastapi, numpy) are imported by the subcommand that runs, so `koordbus calc`
# and `--help` start fast.

log = logging.getLogger(__name__)


def add_parser(sub: Any) -> None:
    service = sub.add_parser(
        "service",
        help="run one control-plane service against an existing NATS (and database)",
        description="nodemetric: agent batches → NodeMetric status (needs --database-url). noderesource: cluster "
        "state + NodeMetrics → batch/mid decisions, projected into --database-url (nodemetric and noderesource "
        "replicas with distinct KOORDBUS_INSTANCE names split the nodes between them). quota: the elastic quota trees "
        "from their event log and the cluster's pods (commands, checks and what-ifs over NATS request/reply; "
        "statuses and history projected into --database-url; replicas need distinct KOORDBUS_INSTANCE names). "
        "migration: arbitrates PodMigrationJobs every 500 ms (MigrationControllerArgs from --args-file; jobs and "
        "decision trails projected into --database-url when given). slo: Nodes + slo-controller-config → each node's "
        "NodeSLO spec in the KOORD_SLO key-value bucket (no database). k8s: "
        "lists and watches Nodes, Pods and the colocation ConfigMap and publishes them (needs --kubeconfig or an "
        "in-cluster service account). natsauth: the NATS auth callout, letting agents in with their ServiceAccount "
        "token as their node's user (KOORDBUS_AGENT_SERVICE_ACCOUNT, KOORDBUS_ISSUER_SEED_FILE, "
        "KOORDBUS_TOKEN_AUDIENCE; TokenReviews need --kubeconfig or an in-cluster service account). loadaware: the "
        "load-aware kube-scheduler extender (filter, prioritize, assume, bind, explain on --port; with "
        "KOORDBUS_TLS_CERT_FILE, KOORDBUS_TLS_KEY_FILE and KOORDBUS_TLS_CLIENT_CA_FILE the verbs move to HTTPS on "
        "KOORDBUS_EXTENDER_PORT (default 9443), served only to client certificates from that CA; "
        "LoadAwareSchedulingArgs from --args-file or KOORDBUS_ARGS_FILE; no database).",
    )
    service.add_argument(
        "name",
        choices=["nodemetric", "noderesource", "slo", "quota", "migration", "k8s", "natsauth", "loadaware"],
        help="which service",
    )
    add_common(service, embedded=False)
    service.add_argument(
        "--port",
        type=int,
        default=9090,
        help="nodemetric, noderesource, quota: health, metrics and the API's read routes on this port (default 9090; "
        "0 = off)",
    )
    service.add_argument(
        "--kubeconfig",
        default=None,
        help="k8s, natsauth: kubeconfig file (default: in-cluster; or KOORDBUS_KUBECONFIG)",
    )
    service.add_argument(
        "--args-file",
        default=os.environ.get("KOORDBUS_MIGRATION_ARGS_FILE"),
        help="migration: MigrationControllerArgs; loadaware: LoadAwareSchedulingArgs; as JSON or YAML, Koordinator's "
        "field names (default: its defaults)",
    )
    service.add_argument(
        "--dry-run",
        action="store_true",
        help="k8s: watch the cluster but write nothing; what would be written is served at /api/v1/k8s/recorded-writes",
    )
    service.set_defaults(run=lambda a: asyncio.run(run_service(a)))


async def run_service(args: argparse.Namespace) -> int:
    match args.name:
        case "noderesource":
            return await _run_noderesource(args)
        case "k8s":
            return await _run_k8s(args)
        case "quota":
            return await _run_quota(args)
        case "migration":
            return await _run_migration(args)
        case "slo":
            return await _run_slo(args)
        case "loadaware":
            return await _run_loadaware(args)
        case "natsauth":
            from koordbus import natsauth

            return await natsauth.run_natsauth(args)
        case _:
            return await _run_nodemetric(args)


async def _run_noderesource(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.common import observe
    from services.common.metrics import new_registry
    from services.nodemetric.store import NodeMetricStore
    from services.noderesource.service import NodeResourceService
    from services.noderesource.settings import NodeResourceSettings
    from services.noderesource.store import NodeResourceStore

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    settings = settings_loader.load(NodeResourceSettings)
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await open_cluster_bus(stack, common, name="noderesource")
        engine = await runtime.open_database(stack, require(common.database_url, "--database-url"), migrate=True)
        store = NodeResourceStore(engine, history_limit=settings.history_limit)
        service = NodeResourceService(bus, settings, registry=registry, store=store)
        await service.start()
        stack.push_async_callback(service.stop)
        await serve_service_port(
            stack,
            args.port,
            registry,
            nodemetric_store=NodeMetricStore(engine),
            noderesource_store=store,
            readiness=(("database", observe.database_ready(engine)), ("bus", observe.bus_ready(bus))),
            liveness=(("bus", runtime.bus_liveness(bus)),),
        )
        await stop.wait()
    return 0


async def _run_loadaware(args: argparse.Namespace) -> int:
    import gc

    from koordbus import runtime
    from services.common.metrics import new_registry
    from services.loadaware.http import create_app
    from services.loadaware.service import LoadAwareService, LoadAwareSettings

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    try:
        settings = settings_loader.load(LoadAwareSettings)
    except settings_loader.SettingsError as e:
        raise SystemExit(f"koordbus service loadaware: {e}") from None
    scheduling_args = loadaware_args(args.args_file or settings.args_file)  # a bad file stops here
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await open_cluster_bus(stack, common, name="loadaware")
        service = LoadAwareService(bus, settings, args=scheduling_args, registry=registry)
        await service.start()
        gc.freeze()  # the replayed state lives as long as the process: keep full collections off it (requests)
        stack.push_async_callback(service.stop)
        if settings.tls:
            tls = runtime.MutualTls(
                cert_file=settings.tls_cert_file,
                key_file=settings.tls_key_file,
                client_ca_file=settings.tls_client_ca_file,
            )
            app = create_app(service, registry, liveness=runtime.bus_liveness(bus))
            await runtime.serve_http(stack, app, host="0.0.0.0", port=settings.extender_port, tls=tls)
        else:
            log.warning(
                "loadaware: the extender verbs are served without TLS on port %s: anyone who reaches it can place "
                "pods (set KOORDBUS_TLS_CERT_FILE, KOORDBUS_TLS_KEY_FILE and KOORDBUS_TLS_CLIENT_CA_FILE, or keep "
                "callers out with a NetworkPolicy)",
                args.port,
            )
        if args.port:
            plain = create_app(service, registry, verbs=not settings.tls, liveness=runtime.bus_liveness(bus))
            await runtime.serve_http(stack, plain, host="0.0.0.0", port=args.port)
        await stop.wait()
    return 0


async def _run_slo(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.common import observe
    from services.common.metrics import new_registry
    from services.slo.reader import SloReader
    from services.slo.service import SloService

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await open_cluster_bus(stack, common, name="slo")
        service = SloService(bus, registry=registry)
        await service.start()
        stack.push_async_callback(service.stop)
        await serve_service_port(
            stack,
            args.port,
            registry,
            slo_reader=SloReader(bus),
            readiness=(("bus", observe.bus_ready(bus)),),
            liveness=(("bus", runtime.bus_liveness(bus)),),
        )
        await stop.wait()
    return 0


async def _run_quota(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.common import observe
    from services.common.metrics import new_registry
    from services.quota.client import QuotaClient

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await open_cluster_bus(stack, common, name="quota")
        engine = await runtime.open_database(stack, require(common.database_url, "--database-url"), migrate=True)
        _, store = await start_quota(stack, bus, engine, registry)
        await serve_service_port(
            stack,
            args.port,
            registry,
            quota_store=store,
            quota_client=QuotaClient(bus),
            readiness=(("database", observe.database_ready(engine)), ("bus", observe.bus_ready(bus))),
            liveness=(("bus", runtime.bus_liveness(bus)),),
        )
        await stop.wait()
    return 0


async def _run_migration(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.common import observe
    from services.common.metrics import new_registry

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    settings = migration_settings(args.args_file)  # a bad args file stops here, before anything connects
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await open_cluster_bus(stack, common, name="migration")
        engine = None
        if common.database_url:
            engine = await runtime.open_database(stack, common.database_url, migrate=True)
        service = await start_migration(stack, bus, registry, settings, engine=engine)
        context: dict[str, Any] = {
            "readiness": (("bus", observe.bus_ready(bus)),),
            "liveness": (("bus", runtime.bus_liveness(bus)),),
        }
        if service.store is not None:
            from services.migration.client import MigrationClient

            context.update(migration_store=service.store, migration_client=MigrationClient(bus))
        await serve_service_port(stack, args.port, registry, **context)
        await stop.wait()
    return 0


async def _run_k8s(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.common import observe
    from services.common.metrics import new_registry

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await open_cluster_bus(stack, common, name="k8s")
        bridge = await bridge_cluster(
            stack, bus, registry, kubeconfig=args.kubeconfig, record_only_without_config=False, dry_run=args.dry_run
        )
        await serve_service_port(
            stack,
            args.port,
            registry,
            recorded_writes=bridge.recorded_writes,
            readiness=(("bus", observe.bus_ready(bus)), *bridge.readiness),
            liveness=(("bus", runtime.bus_liveness(bus)),),
        )
        await stop.wait()
    return 0


async def _run_nodemetric(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.common import observe
    from services.common.metrics import new_registry
    from services.nodemetric.service import NodeMetricService
    from services.nodemetric.settings import NodeMetricSettings
    from services.nodemetric.store import NodeMetricStore

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await open_cluster_bus(stack, common, name="nodemetric")
        engine = await runtime.open_database(stack, require(common.database_url, "--database-url"), migrate=True)
        store = NodeMetricStore(engine)
        service = NodeMetricService(bus, store, settings_loader.load(NodeMetricSettings), registry=registry)
        await service.start()
        stack.push_async_callback(service.stop)
        await serve_service_port(
            stack,
            args.port,
            registry,
            nodemetric_store=store,
            readiness=(("database", observe.database_ready(engine)), ("bus", observe.bus_ready(bus))),
            liveness=(("bus", runtime.bus_liveness(bus)),),
            before_metrics=(service.refresh_gauges,),
        )
        await stop.wait()
    return 0
