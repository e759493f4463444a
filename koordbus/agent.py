"""`koordbus agent`: the node agent against an existing NATS. It runs on every node, so this module and what it
imports stay small (koordbus.cli loads only this subcommand for `koordbus agent`; bench/agent.py measures it).
"""

from __future__ import annotations

import argparse
import gc
import sys
import time
from contextlib import AsyncExitStack
from typing import Any

from koordbus import arg_types
from koordbus.common import add_common, common_settings, local_node_name, open_cluster_bus
from services.common import settings as settings_loader


def add_parser(sub: Any) -> None:
    agent = sub.add_parser("agent", help="run the node agent against an existing NATS")
    add_common(agent, embedded=False)
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
    agent.add_argument(
        "--cpi",
        dest="cpi_collect",
        action="store_true",
        default=None,
        help="count each pod's cycles and instructions with perf counters (koordlet's CPICollector; default off, or "
        "KOORDBUS_AGENT_CPI_COLLECT); where the kernel does not allow it the agent says so once and reports none",
    )
    agent.add_argument("--resctrl-root", default=None, help="resctrl mount (default /sys/fs/resctrl)")
    agent.add_argument(
        "--port",
        type=arg_types.port,
        default=9100,
        help="/healthz, /readyz (NATS reachable) and /metrics on this port (default 9100; 0 = off)",
    )
    agent.add_argument(
        "--evict",
        default=None,
        metavar="FEATURES",
        help="eviction features on, comma-separated: BEMemoryEvict, MemoryEvict, BECPUEvict, CPUEvict (default "
        "none, as in Koordinator); each also needs resourceUsedThresholdWithBE.enable in the NodeSLO",
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
    agent.set_defaults(run=_run)


def _run(args: argparse.Namespace) -> int:
    # Only what the agent needs: it runs on every node (no FastAPI, SQLAlchemy or aiohttp; bench/agent.py).
    if "nats" not in sys.modules:
        # nats-py imports aiohttp, when installed, for ws:// URLs only: 15 MB of every agent for a transport agents
        # do not use. Such a URL then fails with nats-py's "Could not import aiohttp transport".
        sys.modules.setdefault("aiohttp", None)  # type: ignore[arg-type]
    from koordbus import runtime

    return runtime.run_command(run_agent(args))


async def run_agent(args: argparse.Namespace) -> int:
    from prometheus_client import CollectorRegistry

    from agent.loops.runner import QosLoops
    from agent.metrics import AgentMetrics
    from agent.pods import KubeletPods
    from agent.port import AgentPort
    from agent.service import AgentService
    from agent.settings import AgentSettings, QosSettings
    from agent.slo_watch import SloSource, refresh_forever
    from agent.topology_watch import reporter_for
    from bus import streams, subjects
    from koordbus import runtime

    common = common_settings(args)
    runtime.configure_logging(args.log_level or common.log_level, args.log_format or common.log_format)
    overrides = {
        "node_name": args.node_name or local_node_name(),
        "proc_root": args.proc_root,
        "cgroup_root": args.cgroup_root,
        "publish_interval": args.publish_interval,
        "cpi_collect": args.cpi_collect,
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
        slo: SloSource | None = None  # this node's NodeSLO: the QoS loops', or read for the host applications alone

        def host_applications() -> object:
            return None if slo is None or slo.spec is None else slo.spec.get("hostApplications")

        agent = AgentService(
            settings,
            bus,
            pods=pods,
            pods_poll_interval=qos_settings.pods_poll_interval,
            host_applications=host_applications,
        )
        runtime.background(stack, agent.run(), name="agent")
        reporter = None
        if settings.topology_report:
            reporter = reporter_for(settings, bus, reserved_cpus=qos_settings.reserved_cpus)
            runtime.background(stack, reporter.run(), name="topology")
        loops = None
        if qos_settings.qos_mode != "off":
            loops = QosLoops(settings, qos_settings, bus, pods=pods, usage=lambda: agent.latest_tick)
            slo = loops.slo
            runtime.background(stack, loops.run(), name="qos")
        else:
            slo = SloSource(bus, settings.node_name, state_dir=qos_settings.state_dir, now=time.time())
            runtime.background(stack, refresh_forever(slo, interval=qos_settings.slo_poll_interval), name="slo")
        registry = CollectorRegistry(auto_describe=True)
        registry.register(AgentMetrics(agent, loops, topology=reporter))

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
