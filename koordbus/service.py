"""`koordbus service <name>`: one control-plane service against an existing NATS (and database).

One generic runner (run_service) does what every service process does: it parses its flags into typed settings at the
edge, opens the bus (and database) with koordbus.runtime, builds the service from its entry in SERVICES, serves its
HTTP port, and runs until Ctrl-C / SIGTERM, then shuts down in reverse order.
"""

from __future__ import annotations

import argparse
import logging
from contextlib import AsyncExitStack
from typing import Any

from koordbus import arg_types, natsauth, webhook
from koordbus.bridge import bridge_cluster
from koordbus.common import (
    ServiceProcess,
    ServiceRunner,
    add_common,
    common_settings,
    open_cluster_bus,
    require,
    serve_service_port,
    service_route_settings,
    watermark_defaults,
)
from koordbus.parts import loadaware_args, migration_settings, start_migration, start_migration_executor
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
        "migration: arbitrates PodMigrationJobs every 500 ms and carries out the passed ones, asking the k8s "
        "service for each cluster verb (MigrationControllerArgs from --args-file; jobs and decision trails projected "
        "into --database-url when given). slo: Nodes + slo-controller-config → each node's "
        "NodeSLO spec in the KOORD_SLO key-value bucket (no database). k8s: "
        "lists and watches Nodes, Pods and the colocation ConfigMap and publishes them (needs --kubeconfig or an "
        "in-cluster service account). natsauth: the NATS auth callout, letting agents in with their ServiceAccount "
        "token as their node's user (KOORDBUS_AGENT_SERVICE_ACCOUNT, KOORDBUS_ISSUER_SEED_FILE, "
        "KOORDBUS_TOKEN_AUDIENCE; TokenReviews need --kubeconfig or an in-cluster service account). loadaware: the "
        "load-aware kube-scheduler extender (filter, prioritize, assume, bind, explain on --port; with "
        "KOORDBUS_TLS_CERT_FILE, KOORDBUS_TLS_KEY_FILE and KOORDBUS_TLS_CLIENT_CA_FILE the verbs move to HTTPS on "
        "KOORDBUS_EXTENDER_PORT (default 9443), served only to client certificates from that CA; "
        "LoadAwareSchedulingArgs from --args-file or KOORDBUS_ARGS_FILE; no database). webhook: the admission "
        "webhook kube-apiserver calls over HTTPS on KOORDBUS_WEBHOOK_PORT (default 9443) with the certificate "
        "KOORDBUS_WEBHOOK_TLS_CERT_FILE / KOORDBUS_WEBHOOK_TLS_KEY_FILE (reloaded when they change): POST "
        "/mutate-pods applies the ClusterColocationProfiles to Pods at CREATE, POST /validate-configmaps refuses a "
        "bad slo-controller-config key with its JSON path (no database; docs/webhook.md).",
    )
    service.add_argument(
        "name",
        choices=["nodemetric", "noderesource", "slo", "quota", "migration", "k8s", "natsauth", "loadaware", "webhook"],
        help="which service",
    )
    add_common(service, embedded=False)
    service.add_argument(
        "--port",
        type=arg_types.port,
        default=9090,
        help="nodemetric, noderesource, quota: health, metrics and the API's read routes on this port (default 9090; "
        "0 = off); loadaware, webhook: health, readiness and metrics",
    )
    service.add_argument(
        "--kubeconfig",
        default=None,
        help="k8s, natsauth: kubeconfig file (default: in-cluster; or KOORDBUS_KUBECONFIG)",
    )
    service.add_argument(
        "--args-file",
        default=None,
        help="migration: MigrationControllerArgs (or KOORDBUS_MIGRATION_ARGS_FILE); loadaware: LoadAwareSchedulingArgs "
        "(or KOORDBUS_LOADAWARE_ARGS_FILE / KOORDBUS_ARGS_FILE); as JSON or YAML, Koordinator's field names (default: "
        "its defaults)",
    )
    service.add_argument(
        "--dry-run",
        action="store_true",
        help="k8s: watch the cluster but write nothing; what would be written is served at /api/v1/k8s/recorded-writes",
    )
    service.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    from koordbus import runtime

    return runtime.run_command(run_service(args))


async def run_service(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.common import observe
    from services.common.metrics import new_registry

    runner = SERVICES[args.name]
    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    prepared = runner.prepare(args) if runner.prepare is not None else None
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        bus = await open_cluster_bus(stack, common, name=args.name, ensure_streams=runner.ensure_streams)
        observe.watch_bus(registry, bus)
        engine = None
        readiness: tuple[tuple[str, Any], ...] = ()
        if runner.database == "required":
            engine = await runtime.open_database(stack, require(common.database_url, "--database-url"), migrate=True)
            readiness = (("database", observe.database_ready(engine)),)
        elif runner.database == "optional" and common.database_url:
            engine = await runtime.open_database(stack, common.database_url, migrate=True)
        context = await runner.build(ServiceProcess(args, stack, bus, registry, engine, prepared))
        if context is not None:
            readiness += (("bus", observe.bus_ready(bus)), *context.pop("readiness", ()))
            if runner.liveness:
                context["liveness"] = (("bus", runtime.bus_liveness(bus)),)
            await serve_service_port(stack, args.port, registry, readiness=readiness, **context)
        await stop.wait()
    return 0


async def _build_nodemetric(process: ServiceProcess) -> dict[str, Any]:
    from services.nodemetric import component
    from services.nodemetric.settings import NodeMetricSettings

    built = await component.build(
        process.stack,
        bus=process.bus,
        engine=process.engine,
        registry=process.registry,
        settings=settings_loader.load(NodeMetricSettings),
        route_settings=service_route_settings(),
    )
    return {"components": (built,)}


def _noderesource_settings(args: argparse.Namespace) -> Any:
    from services.noderesource.settings import NodeResourceSettings

    return settings_loader.load(NodeResourceSettings)


async def _build_noderesource(process: ServiceProcess) -> dict[str, Any]:
    from services.nodemetric import component as nodemetric_component
    from services.nodemetric.store import NodeMetricStore
    from services.noderesource import component

    built = await component.build(
        process.stack, bus=process.bus, engine=process.engine, registry=process.registry, settings=process.prepared
    )
    nodemetric_reads = nodemetric_component.reads(
        NodeMetricStore(process.engine), service_route_settings(), bus=process.bus
    )
    return {"components": (nodemetric_reads, built)}


async def _build_slo(process: ServiceProcess) -> dict[str, Any]:
    from services.common.watermark_feed import WatermarkReader
    from services.slo import component
    from services.slo.service import SloService

    service = SloService(process.bus, registry=process.registry)
    await service.start()
    process.stack.push_async_callback(service.stop)
    return {
        "components": (component.reads(process.bus),),
        "watermark_reader": WatermarkReader(process.bus),
        "watermark_defaults": watermark_defaults(),
    }


async def _build_quota(process: ServiceProcess) -> dict[str, Any]:
    import gc

    from services.quota import component
    from services.quota.settings import QuotaSettings

    settings = settings_loader.load(QuotaSettings)
    built = await component.build(
        process.stack, bus=process.bus, engine=process.engine, registry=process.registry, settings=settings
    )
    # what start-up built (the modules, the replayed trees) lives as long as the process: keep full collections off
    # it, so a command (a REST write, an ElasticQuota change a kubectl user waits for) meets no 80–100 ms pause
    gc.freeze()
    return {"components": (built,)}


def _migration_settings(args: argparse.Namespace) -> Any:
    return migration_settings(args.args_file)


async def _build_migration(process: ServiceProcess) -> dict[str, Any]:
    service = await start_migration(
        process.stack, process.bus, process.registry, process.prepared, engine=process.engine
    )
    # passed jobs are carried out here; the cluster verbs go to the bridge (`service k8s`), which holds the credentials
    await start_migration_executor(process.stack, process.bus, process.registry, process.prepared)
    if service.store is None:
        return {}
    from services.migration import component
    from services.migration.client import MigrationClient

    return {"components": (component.routes_over(service.store, MigrationClient(process.bus)),)}


async def _build_k8s(process: ServiceProcess) -> dict[str, Any]:
    args = process.args
    bridge = await bridge_cluster(
        process.stack,
        process.bus,
        process.registry,
        kubeconfig=args.kubeconfig,
        record_only_without_config=False,
        dry_run=args.dry_run,
    )
    from services.k8s import component

    return {"components": (component.recorded_writes(bridge.recorded_writes),), "readiness": bridge.readiness}


def _loadaware_settings(args: argparse.Namespace) -> Any:
    from services.loadaware.settings import LoadAwareSettings

    try:
        settings = settings_loader.load(LoadAwareSettings)
    except settings_loader.SettingsError as e:
        raise SystemExit(f"koordbus service loadaware: {e}") from None
    return settings, loadaware_args(args.args_file or settings.args_file)  # a bad file stops here


async def _build_loadaware(process: ServiceProcess) -> None:
    import gc

    from koordbus import http_serve, runtime
    from services.loadaware.http import create_app
    from services.loadaware.service import LoadAwareService

    args, stack, bus, registry = process.args, process.stack, process.bus, process.registry
    settings, scheduling_args = process.prepared
    service = LoadAwareService(bus, settings, args=scheduling_args, registry=registry)
    await service.start()
    gc.freeze()  # the replayed state lives as long as the process: keep full collections off it (requests)
    stack.push_async_callback(service.stop)
    if settings.tls:
        tls = http_serve.MutualTls(
            cert_file=settings.tls_cert_file,
            key_file=settings.tls_key_file,
            client_ca_file=settings.tls_client_ca_file,
        )
        app = create_app(service, registry, liveness=runtime.bus_liveness(bus))
        await http_serve.serve_http(stack, app, host="0.0.0.0", port=settings.extender_port, tls=tls)
    else:
        log.warning(
            "loadaware: the extender verbs are served without TLS on port %s: anyone who reaches it can place "
            "pods (set KOORDBUS_TLS_CERT_FILE, KOORDBUS_TLS_KEY_FILE and KOORDBUS_TLS_CLIENT_CA_FILE, or keep "
            "callers out with a NetworkPolicy)",
            args.port,
        )
    if args.port:
        plain = create_app(service, registry, verbs=not settings.tls, liveness=runtime.bus_liveness(bus))
        await http_serve.serve_http(stack, plain, host="0.0.0.0", port=args.port)
    return None


SERVICES: dict[str, ServiceRunner] = {
    "nodemetric": ServiceRunner(_build_nodemetric, database="required"),
    "noderesource": ServiceRunner(_build_noderesource, prepare=_noderesource_settings, database="required"),
    "slo": ServiceRunner(_build_slo),
    "quota": ServiceRunner(_build_quota, database="required"),
    "migration": ServiceRunner(_build_migration, prepare=_migration_settings, database="optional"),
    "k8s": ServiceRunner(_build_k8s),
    "natsauth": ServiceRunner(
        natsauth.build_natsauth, prepare=natsauth.natsauth_settings, ensure_streams=False, liveness=False
    ),
    "loadaware": ServiceRunner(_build_loadaware, prepare=_loadaware_settings),
    "webhook": ServiceRunner(webhook.build_webhook, prepare=webhook.webhook_settings),
}
"""Every `koordbus service <name>` (the parser's choices)."""
