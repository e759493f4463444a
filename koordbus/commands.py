"""The long-running subcommands: `up` (everything in one process), `agent`, `service <name>`, `api`.

Each parses its flags into typed settings at the edge, builds the parts with koordbus.runtime,
and runs until Ctrl-C / SIGTERM, then shuts down in reverse order.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import os
import re
import socket
import sys
from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bus import streams
from koordbus.settings import CommonSettings, EmbeddedStreamSettings
from services.common import settings as settings_loader

if TYPE_CHECKING:
    from services.api.auth import TokenStore
    from services.api.settings import ApiSettings

# The heavy parts (nats, sqlalchemy, fastapi, numpy) are imported by the subcommand that runs, so `koordbus calc`
# and `--help` start fast.

log = logging.getLogger(__name__)

API_TOKEN_FILE = "api-token"
"""`koordbus up` without a token file: the generated admin token, in the data dir (mode 0600)."""
NATS_CREDS_FILE = "nats-creds.json"
"""`koordbus up` with its embedded nats-server: the credentials of the one NATS user it lets in, which every
in-process client connects as (generated on first start, mode 0600; pass it as --nats-creds to join another
process)."""


def local_node_name() -> str:
    """This host's name as a DNS-1123 node name."""
    name = re.sub(r"[^a-z0-9.-]", "-", socket.gethostname().lower()).strip("-.") or "localhost"
    return name[:253]


def common_settings(args: argparse.Namespace) -> CommonSettings:
    return settings_loader.load(
        CommonSettings,
        {
            "nats_url": args.nats_url,
            "database_url": args.database_url,
            "data_dir": getattr(args, "data_dir", None),
            "nats_creds": getattr(args, "nats_creds", None),
            "nats_token_file": getattr(args, "nats_token_file", None),
        },
    )


def _add_common(p: argparse.ArgumentParser, *, embedded: bool) -> None:
    where = " (default: start an embedded one)" if embedded else " (required, or KOORDBUS_NATS_URL)"
    p.add_argument("--nats-url", help="NATS server URL" + where)
    p.add_argument(
        "--database-url",
        help="sqlite:///path or postgresql://user@host/db"
        + (" (default: SQLite in the data dir)" if embedded else " (or KOORDBUS_DATABASE_URL)"),
    )
    p.add_argument("--log-level", default=None, help="DEBUG, INFO (default), WARNING …")
    p.add_argument(
        "--log-format",
        default=None,
        choices=("text", "json"),
        help="text (default) or json: one JSON object per line, with the event id and node while an event is "
        "handled (or KOORDBUS_LOG_FORMAT)",
    )
    if not embedded:
        p.add_argument(
            "--nats-creds",
            default=None,
            help="NATS credentials file from `koordbus creds` (or KOORDBUS_NATS_CREDS; default: anonymous)",
        )
        p.add_argument(
            "--nats-token-file",
            default=None,
            help="connect to NATS with the token in this file, read again at every reconnect: an agent's projected "
            "ServiceAccount token for the NATS auth callout (or KOORDBUS_NATS_TOKEN_FILE)",
        )


def add_parsers(sub: Any) -> None:
    up = sub.add_parser(
        "up",
        help="run everything on this machine: embedded NATS, SQLite, services, a local agent and the API",
        description="Start the embedded default: nats-server from the wheel (JetStream, data in --data-dir), SQLite "
        "in the same directory, the nodemetric service, an agent for this host and the API. Ctrl-C stops it.",
    )
    _add_common(up, embedded=True)
    up.add_argument("--data-dir", help="where the NATS store, logs and SQLite live (default .koordbus)")
    up.add_argument("--host", default="127.0.0.1", help="API bind address (default 127.0.0.1)")
    up.add_argument("--port", type=int, default=8080, help="API port (default 8080)")
    up.add_argument(
        "--api-tokens-file",
        default=None,
        help="API token file ('token role [name]' per line; default: an admin token generated in the data dir)",
    )
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

    agent = sub.add_parser("agent", help="run the node agent against an existing NATS")
    _add_common(agent, embedded=False)
    agent.add_argument("--node-name", default=None, help="this node's Kubernetes name (default: hostname)")
    agent.add_argument("--proc-root", default=None, help="procfs mount (default /proc)")
    agent.add_argument("--cgroup-root", default=None, help="cgroup mount (default /sys/fs/cgroup)")
    agent.add_argument("--publish-interval", type=float, default=None, help="seconds per batch (default 10)")
    mode = agent.add_mutually_exclusive_group()
    mode.add_argument(
        "--dry-run",
        dest="qos_mode",
        action="store_const",
        const="dry-run",
        help="QoS loops plan, log and publish what they would write, and write nothing (the default)",
    )
    mode.add_argument(
        "--apply", dest="qos_mode", action="store_const", const="apply", help="QoS loops write cgroup and resctrl files"
    )
    mode.add_argument("--no-qos", dest="qos_mode", action="store_const", const="off", help="run only the metrics half")
    agent.add_argument(
        "--kubelet-pods-url",
        default=None,
        help="the kubelet's pod list, read by the metrics half (pod names and classes) and the QoS loops, e.g. "
        "https://127.0.0.1:10250/pods or the read-only http://127.0.0.1:10255/pods (default: none, pods reported by "
        "UID only and only node-level loops; or KOORDBUS_KUBELET_PODS_URL)",
    )
    agent.add_argument(
        "--kubelet-token-file",
        default=None,
        help="bearer token for the kubelet's secure port, e.g. /var/run/secrets/kubernetes.io/serviceaccount/token "
        "(default: none; or KOORDBUS_KUBELET_TOKEN_FILE)",
    )
    kubelet_tls = agent.add_mutually_exclusive_group()
    kubelet_tls.add_argument(
        "--kubelet-ca-file",
        default=None,
        help="CA that signed the kubelet's serving certificate (default: the system's; or KOORDBUS_KUBELET_CA_FILE)",
    )
    kubelet_tls.add_argument(
        "--kubelet-insecure",
        action="store_true",
        default=None,
        help="do not verify the kubelet's certificate (self-signed by default)",
    )
    agent.add_argument("--resctrl-root", default=None, help="resctrl mount (default /sys/fs/resctrl)")
    agent.add_argument(
        "--port",
        type=int,
        default=9100,
        help="/healthz, /readyz (NATS reachable) and /metrics on this port (default 9100; 0 = off)",
    )
    agent.add_argument(
        "--evict",
        default=None,
        metavar="FEATURES",
        help="eviction features on, comma-separated: BEMemoryEvict, MemoryEvict, BECPUEvict (default none, as in "
        "Koordinator); each also needs resourceUsedThresholdWithBE.enable in the NodeSLO",
    )
    agent.add_argument(
        "--evict-locally",
        action="store_true",
        default=None,
        help="when an eviction request cannot be published (NATS away), kill the pod's containers here instead",
    )
    agent.add_argument(
        "--state-dir",
        default=None,
        help="where the last good NodeSLO is kept across restarts (default /var/lib/koordbus)",
    )
    agent.set_defaults(run=lambda a: asyncio.run(run_agent(a)))

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
    _add_common(service, embedded=False)
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

    db = sub.add_parser(
        "db",
        help="database schema: bring it to this version (the migration step of a deployment)",
        description="upgrade: apply every alembic migration the database lacks (idempotent; concurrent runs "
        "serialize on a lock). Services also migrate at start; a deployment runs this once before them.",
    )
    db.add_argument("action", choices=["upgrade"], help="what to do")
    _add_common(db, embedded=False)
    db.set_defaults(run=lambda a: asyncio.run(run_db(a)))

    api = sub.add_parser("api", help="run the REST API against an existing NATS and database")
    _add_common(api, embedded=False)
    api.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    api.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    api.add_argument(
        "--api-tokens-file", default=None, help="token file, 'token role [name]' per line (required unless --no-auth)"
    )
    api.add_argument(
        "--no-auth", action="store_true", help="INSECURE: serve every route to anyone, without bearer tokens"
    )
    api.add_argument(
        "--token-review-roles",
        default=os.environ.get("KOORDBUS_TOKEN_REVIEW_ROLES", ""),
        metavar="MAPPING",
        help="also accept tokens Kubernetes vouches for (TokenReview, in-cluster or --kubeconfig), with roles by user "
        "or group, e.g. 'group:koordbus-viewers=viewer,user:alice=admin' (or KOORDBUS_TOKEN_REVIEW_ROLES)",
    )
    api.add_argument("--kubeconfig", default=None, help="with --token-review-roles: the cluster (default: in-cluster)")
    api.set_defaults(run=lambda a: asyncio.run(run_api(a)))


async def open_cluster_bus(
    stack: AsyncExitStack, common: CommonSettings, *, name: str, ensure_streams: bool = True
) -> Any:
    """The bus of a process joining an existing NATS (KOORDBUS_NATS_URL) as the user of KOORDBUS_NATS_CREDS, its
    streams at KOORDBUS_STREAM_REPLICAS."""
    from koordbus import runtime

    url = _require(common.nats_url, "--nats-url")
    return await runtime.open_bus(
        stack,
        url,
        name=name,
        replicas=common.stream_replicas,
        creds=common.nats_creds,
        token_file=common.nats_token_file,
        ensure_streams=ensure_streams,
    )


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


def _require(value: str, what: str) -> str:
    if not value:
        raise SystemExit(f"koordbus: {what} is required (flag or environment variable)")
    return value


def api_tokens(settings: ApiSettings, *, command: str, data_dir: Path | None = None) -> TokenStore:
    """The API's TokenStore: from the token file; else (`up`) the admin token in the data dir, generated on first
    start; else the command cannot start. With auth disabled every caller is admin, which is logged loudly."""
    from services.api import auth

    if not settings.auth_enabled:
        log.warning("API AUTHENTICATION IS DISABLED: anyone who reaches the port can read and change everything")
        return auth.TokenStore.disabled()
    if settings.api_tokens_file:
        try:
            return auth.load_token_file(settings.api_tokens_file)
        except auth.TokenFileError as e:
            raise SystemExit(f"koordbus {command}: {e}") from e
    if data_dir is None:
        raise SystemExit(
            f"koordbus {command}: no API token file: pass --api-tokens-file (or set KOORDBUS_API_TOKENS_FILE) "
            "with 'token role [name]' lines, or --no-auth to serve without authentication (insecure)"
        )
    path = data_dir / API_TOKEN_FILE
    token, created = auth.ensure_admin_token(path)
    log.info(
        "API admin token %s %s (send it as 'Authorization: Bearer <token>')",
        "written to" if created else "read from",
        path,
    )
    return auth.TokenStore.single(token, name="koordbus-up")


async def run_up(args: argparse.Namespace) -> int:
    from agent.service import AgentService
    from agent.settings import AgentSettings
    from koordbus import runtime, simulation
    from services.api.app import ApiContext, create_app
    from services.api.settings import ApiSettings
    from services.common import observe
    from services.common.metrics import new_registry
    from services.migration.client import MigrationClient
    from services.nodemetric.service import NodeMetricService
    from services.nodemetric.settings import NodeMetricSettings
    from services.nodemetric.store import NodeMetricStore
    from services.noderesource.service import NodeResourceService
    from services.noderesource.settings import NodeResourceSettings
    from services.noderesource.store import NodeResourceStore
    from services.quota.client import QuotaClient
    from services.slo.reader import SloReader
    from services.slo.service import SloService

    common = common_settings(args)
    stream_caps = settings_loader.load(EmbeddedStreamSettings).caps()
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    os.umask(0o077)  # the database, its -wal/-shm, the NATS store and logs: this user's only
    data_dir = prepare_data_dir(common.data_dir)
    if not runtime.port_is_free(args.host, args.port):
        raise SystemExit(f"koordbus up: port {args.port} on {args.host} is in use; pass --port")
    api_settings = settings_loader.load(
        ApiSettings, {"host": args.host, "port": args.port, "api_tokens_file": args.api_tokens_file}
    )
    tokens = api_tokens(api_settings, command="up", data_dir=data_dir)
    nm_settings = settings_loader.load(NodeMetricSettings)
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        creds = common.nats_creds
        if common.nats_url:
            nats_url = common.nats_url
        else:  # no anonymous access, even on loopback: other local users must not read or write the streams
            creds = str(data_dir / NATS_CREDS_FILE)
            user = runtime.ensure_nats_user(Path(creds), service="up")
            nats_url = await runtime.open_embedded_nats(stack, data_dir, user=user)
        database_url = common.database_url or f"sqlite:///{data_dir / 'koordbus.db'}"
        bus = await runtime.open_bus(stack, nats_url, name="koordbus-up", creds=creds, caps=stream_caps)
        engine = await runtime.open_database(stack, database_url, migrate=True)
        store = NodeMetricStore(engine)
        nodemetric = NodeMetricService(bus, store, nm_settings, registry=registry)
        await nodemetric.start()
        stack.push_async_callback(nodemetric.stop)
        nr_settings = settings_loader.load(NodeResourceSettings)
        nr_store = NodeResourceStore(engine, history_limit=nr_settings.history_limit)
        noderesource = NodeResourceService(bus, nr_settings, registry=registry, store=nr_store)
        await noderesource.start()
        stack.push_async_callback(noderesource.stop)
        slo = SloService(bus, registry=registry)
        await slo.start()
        stack.push_async_callback(slo.stop)
        _, quota_store = await start_quota(stack, bus, engine, registry)
        migration_service = await start_migration(
            stack, bus, registry, migration_settings(os.environ.get("KOORDBUS_MIGRATION_ARGS_FILE")), engine=engine
        )
        cluster = await _bridge_cluster(
            stack, bus, registry, kubeconfig=args.kubeconfig, record_only_without_config=True, dry_run=args.dry_run
        )
        app = create_app(
            ApiContext(
                settings=api_settings,
                nodemetric_store=store,
                noderesource_store=nr_store,
                quota_store=quota_store,
                quota_client=QuotaClient(bus),
                migration_store=migration_service.store,
                migration_client=MigrationClient(bus),
                slo_reader=SloReader(bus),
                event_hub=await _event_hub(stack, bus, api_settings),
                recorded_writes=cluster.recorded_writes,
                registry=registry,
                tokens=tokens,
                readiness=(
                    ("database", observe.database_ready(engine)),
                    ("bus", observe.bus_ready(bus)),
                    *cluster.readiness,
                ),
                liveness=(("bus", runtime.bus_liveness(bus)),),
                before_metrics=(nodemetric.refresh_gauges,),
            )
        )
        await runtime.serve_http(stack, app, host=api_settings.host, port=api_settings.port)
        if not args.no_agent:
            agent = AgentService(settings_loader.load(AgentSettings, {"node_name": local_node_name()}), bus)
            runtime.background(stack, agent.run(), name="agent")
        if args.simulate_nodes:
            nodes = simulation.make_nodes(args.simulate_nodes, pods_per_node=args.simulate_pods)
            # Without a real cluster the simulation publishes its nodes, so the noderesource service decides their
            # batch resources and the simulated batch pods follow them (with a real cluster it never would).
            simulated_cluster = cluster.recorded_writes is not None
            runtime.background(
                stack,
                simulation.run_simulation(
                    bus,
                    nodes,
                    backfill_seconds=args.simulate_backfill,
                    cluster=simulated_cluster,
                    close_loop=simulated_cluster,
                ),
                name="simulation",
            )
        base = f"http://{api_settings.host}:{api_settings.port}"
        tokens_where = (
            api_settings.api_tokens_file
            if api_settings.api_tokens_file
            else f"{data_dir / API_TOKEN_FILE} (role admin)"
            if api_settings.auth_enabled
            else "NONE: authentication disabled"
        )
        print(
            f"koordbus is up.\n"
            f"  dashboard   {base}/   (events: {base}/api/v1/events/stream)\n"
            f"  API         {base}/api/v1/nodemetrics   (docs: {base}/docs, metrics: {base}/metrics)\n"
            f"  NATS        {nats_url}   (credentials: {creds or 'none'})\n"
            f"  database    {database_url}\n"
            f"  data dir    {data_dir}   (streams capped: {_caps_banner(stream_caps)})\n"
            f"  API token   {tokens_where}\n"
            f"  agent       {'off' if args.no_agent else local_node_name()}"
            f"   simulated nodes: {args.simulate_nodes}\n"
            f"  cluster     {cluster.banner}\n"
            f"NodeMetrics appear after the first report interval ({nm_settings.report_interval_seconds} s of samples)."
            f" Ctrl-C stops.",
            flush=True,
        )
        await stop.wait()
        print("koordbus: shutting down …", flush=True)
    return 0


def _caps_banner(caps: streams.SizeCaps) -> str:
    """`KOORD_NODE 1536 MiB, …` for the banner (a stream without a cap is left out)."""
    named = ((streams.KOORD_NODE, caps.node), (streams.KOORD_NODEMETRIC, caps.nodemetric),
             (streams.KOORD_NODERESOURCE, caps.noderesource))  # fmt: skip
    return ", ".join(f"{name} {size / 2**20:g} MiB" for name, size in named if size > 0) or "none"


@dataclass
class _Bridge:
    """What `koordbus up` runs of services.k8s: a banner line, readiness checks, and in record-only mode the
    recording sink's export for the API."""

    banner: str
    readiness: list[tuple[str, Any]]
    recorded_writes: Any = None


async def _bridge_cluster(
    stack: AsyncExitStack,
    bus: Any,
    registry: Any,
    *,
    kubeconfig: str | None,
    record_only_without_config: bool,
    dry_run: bool = False,
) -> _Bridge:
    """With a kubeconfig (or, for `service k8s`, in a pod): watch that cluster and write results back. Without
    one, `koordbus up` records what would be written; `service k8s` refuses to start."""
    from services.k8s.binder import BindResponder, KubeBinder
    from services.k8s.client import KubeConfigError, api_client
    from services.k8s.eviction_executor import EvictionExecutor, KubeEvictor
    from services.k8s.migration_executor import MigrationExecutor
    from services.k8s.nodeslo_mirror import KubeNodeSloSink, NodeSloMirror
    from services.k8s.observer import ClusterObserver
    from services.k8s.quota_mirror import KubeQuotaSink, QuotaMirror
    from services.k8s.settings import K8sSettings
    from services.k8s.sinks import KubeSink, RecordingSink
    from services.k8s.writer import ClusterWriter

    settings = settings_loader.load(K8sSettings, {"kubeconfig": kubeconfig})
    in_cluster = not record_only_without_config and bool(os.environ.get("KUBERNETES_SERVICE_HOST"))
    if not settings.kubeconfig and not in_cluster:
        if not record_only_without_config:
            raise SystemExit("koordbus: no cluster: pass --kubeconfig (or KOORDBUS_KUBECONFIG), or run in a pod")
        recorder = RecordingSink(keep=settings.recorded_writes_kept)
        writer = ClusterWriter(bus, recorder, settings=settings, registry=registry)
        await writer.start()
        stack.push_async_callback(writer.stop)
        return _Bridge(
            banner="none: record-only, see /api/v1/k8s/recorded-writes (--kubeconfig watches and writes a cluster)",
            readiness=[],
            recorded_writes=await _record_quotas(stack, bus, registry, settings, recorder.export),
        )
    try:
        api = await api_client(settings)
    except KubeConfigError as e:
        raise SystemExit(f"koordbus: {e}") from None
    stack.push_async_callback(api.close)
    observer = ClusterObserver(bus, api, settings, registry=registry)
    await observer.start()
    stack.push_async_callback(observer.stop)
    source = settings.kubeconfig or "the in-cluster service account"
    if dry_run:  # watch the real cluster, decide, but only record what would be written
        recorder = RecordingSink(keep=settings.recorded_writes_kept)
        writer = ClusterWriter(bus, recorder, settings=settings, registry=registry)
        await writer.start()
        stack.push_async_callback(writer.stop)
        return _Bridge(
            banner=f"watching via {source}, dry run: see /api/v1/k8s/recorded-writes",
            readiness=[],
            recorded_writes=await _record_quotas(stack, bus, registry, settings, recorder.export),
        )
    sink = KubeSink(
        api, conflict_retries=settings.write_conflict_retries, request_timeout=settings.write_timeout_seconds
    )
    writer = ClusterWriter(bus, sink, settings=settings, registry=registry)
    await writer.start()
    stack.push_async_callback(writer.stop)
    readiness: list[tuple[str, Any]] = [("kubernetes", writer.readiness)]
    nodeslo_mirror = NodeSloMirror(
        bus,
        KubeNodeSloSink(
            api, conflict_retries=settings.write_conflict_retries, request_timeout=settings.write_timeout_seconds
        ),
        settings=settings,
        registry=registry,
    )
    await nodeslo_mirror.start()
    stack.push_async_callback(nodeslo_mirror.stop)
    readiness.append(("kubernetes-nodeslos", nodeslo_mirror.readiness))
    evictions = EvictionExecutor(
        bus, KubeEvictor(api, request_timeout=settings.write_timeout_seconds), registry=registry
    )
    await evictions.start()
    stack.push_async_callback(evictions.stop)
    if settings.bind_pods:
        binder = BindResponder(bus, KubeBinder(api, request_timeout=settings.write_timeout_seconds), registry=registry)
        await binder.start()
        stack.push_async_callback(binder.stop)
    executor = MigrationExecutor(
        bus, api, migration_settings(os.environ.get("KOORDBUS_MIGRATION_ARGS_FILE")).args, registry=registry
    )
    await executor.start()
    stack.push_async_callback(executor.stop)
    if settings.mirror_quotas:
        quota_sink = KubeQuotaSink(
            api, conflict_retries=settings.write_conflict_retries, request_timeout=settings.write_timeout_seconds
        )
        mirror = QuotaMirror(bus, quota_sink, settings=settings, registry=registry)
        await mirror.start()
        stack.push_async_callback(mirror.stop)
        readiness.append(("kubernetes-quotas", mirror.readiness))
    return _Bridge(banner=f"watching and writing via {source}", readiness=readiness)


async def _record_quotas(
    stack: AsyncExitStack, bus: Any, registry: Any, settings: Any, nodes_export: Any
) -> Callable[[], Any]:
    """Record-only mode for the quota and NodeSLO mirrors and the agents' evictions too: what the recorded-writes
    route shows, ElasticQuotas, NodeSLOs and evictions included."""
    from services.k8s.eviction_executor import EvictionExecutor, RecordingEvictor
    from services.k8s.nodeslo_mirror import NodeSloMirror, RecordingNodeSloSink
    from services.k8s.quota_mirror import QuotaMirror, RecordingQuotaSink

    evictor = RecordingEvictor(keep=settings.recorded_writes_kept)
    executor = EvictionExecutor(bus, evictor, registry=registry)
    await executor.start()
    stack.push_async_callback(executor.stop)
    nodeslo_sink = RecordingNodeSloSink(keep=settings.recorded_writes_kept)
    nodeslo_mirror = NodeSloMirror(bus, nodeslo_sink, settings=settings, registry=registry)
    await nodeslo_mirror.start()
    stack.push_async_callback(nodeslo_mirror.stop)
    quota_sink = None
    if settings.mirror_quotas:
        quota_sink = RecordingQuotaSink(keep=settings.recorded_writes_kept)
        mirror = QuotaMirror(bus, quota_sink, settings=settings, registry=registry)
        await mirror.start()
        stack.push_async_callback(mirror.stop)

    def export() -> Any:
        quotas = {"quotas": quota_sink.export()} if quota_sink is not None else {}
        return {**nodes_export(), **quotas, "nodeslos": nodeslo_sink.export(), "evictions": evictor.export()}

    return export


async def run_agent(args: argparse.Namespace) -> int:
    # Only what the agent needs: it runs on every node (no FastAPI, SQLAlchemy or aiohttp; bench/agent.py).
    if "nats" not in sys.modules:
        # nats-py imports aiohttp, when installed, for ws:// URLs only: 15 MB of every agent for a transport agents
        # do not use. Such a URL then fails with nats-py's "Could not import aiohttp transport".
        sys.modules.setdefault("aiohttp", None)  # type: ignore[arg-type]
    from prometheus_client import CollectorRegistry

    from agent.metrics import AgentMetrics
    from agent.pods import KubeletPods
    from agent.port import AgentPort
    from agent.qos_loops import QosLoops
    from agent.service import AgentService
    from agent.settings import AgentSettings, QosSettings
    from bus import subjects
    from koordbus import runtime

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    overrides = {
        "node_name": args.node_name or local_node_name(),
        "proc_root": args.proc_root,
        "cgroup_root": args.cgroup_root,
        "publish_interval": args.publish_interval,
    }
    settings = settings_loader.load(AgentSettings, overrides)
    qos_settings = settings_loader.load(
        QosSettings,
        {
            "qos_mode": args.qos_mode,
            "kubelet_pods_url": args.kubelet_pods_url,
            "kubelet_token_file": args.kubelet_token_file,
            "kubelet_ca_file": args.kubelet_ca_file,
            "kubelet_insecure": args.kubelet_insecure,
            "resctrl_root": args.resctrl_root,
            "state_dir": args.state_dir,
            "evict_features": args.evict,
            "evict_locally": args.evict_locally,
        },
    )
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        # streams are the control plane's to create: an agent's NATS user may only publish as its node
        bus = await open_cluster_bus(stack, common, name=f"agent-{settings.node_name}", ensure_streams=False)
        pods = None
        if qos_settings.kubelet_pods_url:  # both halves read it: pod names in the metrics, pods for the QoS loops
            pods = KubeletPods(
                qos_settings.kubelet_pods_url,
                token_file=qos_settings.kubelet_token_file,
                ca_file=qos_settings.kubelet_ca_file,
                insecure=qos_settings.kubelet_insecure,
            )
            stack.push_async_callback(pods.close)
        agent = AgentService(settings, bus, pods=pods, pods_poll_interval=qos_settings.pods_poll_interval)
        runtime.background(stack, agent.run(), name="agent")
        loops = None
        if qos_settings.qos_mode != "off":
            loops = QosLoops(settings, qos_settings, bus, pods=pods, usage=lambda: agent.latest_tick)
            runtime.background(stack, loops.run(), name="qos")
        registry = CollectorRegistry(auto_describe=True)
        registry.register(AgentMetrics(agent, loops))

        async def bus_answers() -> None:  # the one read an agent's NATS user may make: its own NodeSLO key
            await bus.last_on_subject(streams.KV_KOORD_SLO, subjects.slo_key(settings.node_name), direct=True)

        if args.port:
            port = AgentPort(registry, readiness=(("bus", bus_answers),))
            await port.start("0.0.0.0", args.port)
            stack.push_async_callback(port.stop)
        gc.freeze()  # what start-up built lives as long as the process: later collections need not scan it
        print(
            f"koordbus agent {settings.node_name}: metrics every {settings.collect_interval:g} s, QoS loops "
            f"{qos_settings.qos_mode}" + ("" if qos_settings.kubelet_pods_url else " (no kubelet: node-level only)"),
            flush=True,
        )
        await stop.wait()
        await agent.stop()
        if loops is not None:
            await loops.stop()
    return 0


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
        engine = await runtime.open_database(stack, _require(common.database_url, "--database-url"), migrate=True)
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


def loadaware_args(path: str) -> Any:
    """LoadAwareSchedulingArgs from `path` (Koordinator's defaults when empty); exits with one line when unusable."""
    from services.loadaware.args import DEFAULT_ARGS, ArgsError, load_args

    if not path:
        return DEFAULT_ARGS
    try:
        return load_args(Path(path).read_text(encoding="utf-8"), source=path)
    except (OSError, UnicodeDecodeError, ArgsError) as e:
        raise SystemExit(f"koordbus: loadaware args: {e}") from None


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


async def start_quota(stack: AsyncExitStack, bus: Any, engine: Any, registry: Any) -> tuple[Any, Any]:
    """The quota service (settings from KOORDBUS_* variables) with its projections; returns (service, store)."""
    from services.quota.service import QuotaService
    from services.quota.settings import QuotaSettings
    from services.quota.store import QuotaStore

    store = QuotaStore(engine)
    service = QuotaService(bus, settings_loader.load(QuotaSettings), registry=registry, store=store)
    await service.start()
    stack.push_async_callback(service.stop)
    return service, store


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
        engine = await runtime.open_database(stack, _require(common.database_url, "--database-url"), migrate=True)
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


def migration_settings(args_file: str | None) -> Any:
    """MigrationSettings from the args file (if any) and KOORDBUS_INSTANCE; exits with a clear line when unusable."""
    import msgspec

    from services.migration.args import ArgsError, MigrationArgs, load_args, low_node_load_section
    from services.migration.lownodeload import LowNodeLoadArgs
    from services.migration.service import MigrationSettings

    migration_args, descheduling = MigrationArgs(), LowNodeLoadArgs()
    if args_file:
        try:
            text = Path(args_file).read_text(encoding="utf-8")
            migration_args = load_args(text, source=args_file)
            descheduling = msgspec.convert(low_node_load_section(text, source=args_file), LowNodeLoadArgs)
        except (OSError, UnicodeDecodeError, ArgsError, msgspec.ValidationError) as e:
            raise SystemExit(f"koordbus: migration args: {e}") from None
    return MigrationSettings(
        args=migration_args, low_node_load=descheduling, instance=os.environ.get("KOORDBUS_INSTANCE", "")
    )


async def start_migration(stack: AsyncExitStack, bus: Any, registry: Any, settings: Any, *, engine: Any = None) -> Any:
    """The arbiter, projecting into the database when `engine` is given."""
    from services.migration.service import MigrationService
    from services.migration.store import MigrationStore

    store = MigrationStore(engine) if engine is not None else None
    service = MigrationService(bus, settings, registry=registry, store=store)
    await service.start()
    stack.push_async_callback(service.stop)
    return service


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


async def _event_hub(stack: AsyncExitStack, bus: Any, settings: Any) -> Any:
    """The API's event subscriptions (services.api.event_hub), closed with the stack."""
    from services.api.event_hub import EventHub

    hub = EventHub(
        bus,
        queue_size=settings.events_queue_size,
        max_subscriptions=settings.events_max_subscriptions,
        max_per_caller=settings.events_max_per_caller,
    )
    stack.push_async_callback(hub.close)
    return hub


async def serve_service_port(stack: AsyncExitStack, port: int, registry: Any, **context: Any) -> None:
    """A service process's HTTP port (0 = none): /healthz, /readyz, /metrics and the read routes of what it holds."""
    from koordbus import runtime
    from services.api import auth
    from services.api.app import ApiContext, create_app
    from services.api.settings import ApiSettings

    if port:
        settings = settings_loader.load(ApiSettings, {"port": port})
        # without a token file the read routes accept no token (health and metrics stay open)
        tokens = auth.load_token_file(settings.api_tokens_file) if settings.api_tokens_file else auth.TokenStore()
        app = create_app(ApiContext(settings=settings, registry=registry, tokens=tokens, **context))
        await runtime.serve_http(stack, app, host="0.0.0.0", port=port)


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
        bridge = await _bridge_cluster(
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
        engine = await runtime.open_database(stack, _require(common.database_url, "--database-url"), migrate=True)
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


async def run_db(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.common import db

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    url = _require(common.database_url, "--database-url")
    await db.run_migrations(url)
    from sqlalchemy.engine import make_url

    shown = make_url(url).render_as_string(hide_password=True)
    print(f"koordbus db: {shown} is at the newest schema", flush=True)
    return 0


async def _token_review(stack: AsyncExitStack, roles: dict[str, str], kubeconfig: str | None) -> Any:
    """Tokens Kubernetes vouches for, with `roles`: a TokenReview client on the cluster."""
    from services.api import auth
    from services.k8s.client import KubeConfigError, api_client
    from services.k8s.settings import K8sSettings
    from services.k8s.token_review import KubeTokenReviewer

    try:
        client = await api_client(settings_loader.load(K8sSettings, {"kubeconfig": kubeconfig}))
    except KubeConfigError as e:
        raise SystemExit(f"koordbus api: TokenReview needs a cluster: {e}") from None
    stack.push_async_callback(client.close)
    return auth.ReviewedTokens(KubeTokenReviewer(client), roles)


async def run_api(args: argparse.Namespace) -> int:
    from koordbus import runtime
    from services.api import auth
    from services.api.app import ApiContext, create_app
    from services.api.settings import ApiSettings
    from services.common import observe
    from services.common.metrics import new_registry
    from services.migration.client import MigrationClient
    from services.migration.store import MigrationStore
    from services.nodemetric.store import NodeMetricStore
    from services.noderesource.store import NodeResourceStore
    from services.quota.client import QuotaClient
    from services.quota.store import QuotaStore
    from services.slo.reader import SloReader

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    settings = settings_loader.load(
        ApiSettings,
        {
            "host": args.host,
            "port": args.port,
            "api_tokens_file": args.api_tokens_file,
            "auth_enabled": False if args.no_auth else None,
        },
    )
    tokens = api_tokens(settings, command="api")
    try:
        review_roles = auth.parse_role_mapping(args.token_review_roles)
    except ValueError as e:
        raise SystemExit(f"koordbus api: --token-review-roles: {e}") from None
    registry = new_registry()
    async with AsyncExitStack() as stack:
        stop = runtime.stop_event_on_signals(stack)
        reviewed = await _token_review(stack, review_roles, args.kubeconfig) if review_roles else None
        bus = await open_cluster_bus(stack, common, name="api")
        engine = await runtime.open_database(stack, _require(common.database_url, "--database-url"), migrate=False)
        app = create_app(
            ApiContext(
                settings=settings,
                nodemetric_store=NodeMetricStore(engine),
                noderesource_store=NodeResourceStore(engine),
                quota_store=QuotaStore(engine),
                quota_client=QuotaClient(bus),
                migration_store=MigrationStore(engine),
                migration_client=MigrationClient(bus),
                slo_reader=SloReader(bus),
                event_hub=await _event_hub(stack, bus, settings),
                registry=registry,
                tokens=tokens,
                reviewed_tokens=reviewed,
                readiness=(("database", observe.database_ready(engine)), ("bus", observe.bus_ready(bus))),
                liveness=(("bus", runtime.bus_liveness(bus)),),
            )
        )
        await runtime.serve_http(stack, app, host=settings.host, port=settings.port)
        await stop.wait()
    return 0
