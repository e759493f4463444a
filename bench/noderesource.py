"""Noderesource benchmark: how fast `koordbus service noderesource` keeps up with N nodes × P pods of NodeMetrics.

Run as `python bench/noderesource.py [flags]` (see --help) and, with tiny flags, by
tests/e2e/test_bench_noderesource_smoke.py. It starts an embedded nats-server, seeds KOORD_CLUSTER with the cluster
of bench.cluster_load (nodes, pods, the colocation ConfigMap) and KOORD_NODEMETRIC with one NodeMetric per node,
then starts the service as a separate process pinned to one CPU (everything else runs on the other CPUs) and
times its start-up replay: spawn → a first decision for every node stored. A publisher process then offers one
NodeMetricComputed per node per --metric-interval, and after --warmup the benchmark measures over --duration:
NodeMetrics offered, published and consumed by the service per second, decisions published and writes due per
second (read from KOORD_NODERESOURCE), NodeMetric report → decision stored latency p50/p99 (a decision triggered
only by a NodeMetric carries that NodeMetric's report time, which is its publish time, as computed_at; the
decision's stream timestamp is when it was stored), the service's CPU use and peak RSS (/proc) and the
nodemetric consumer's backlog. The service serves no /metrics yet, so recomputations that were not published
(repeats) are not counted. Exactly one JSON line goes to stdout; progress goes to stderr. Every process it started
is stopped on the way out, also on Ctrl-C. With --replicas N it starts N noderesource processes with instance names,
each pinned to a CPU of its own, waits until they have split the node partitions and replayed their share, and
reports their figures added up (and each replica's CPU and RSS); bench/scale.py compares 1 and 2 replicas this way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import multiprocessing
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any

import msgspec
from nats.aio.msg import Msg
from nats.js.api import DeliverPolicy

if __package__ in (None, ""):  # run as a script (`python bench/noderesource.py`): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import cluster_load, measure, processes
from bus import streams, subjects
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from services.common import membership
from services.noderesource.service import CLUSTER_CONSUMER, NODEMETRIC_CONSUMER

log = logging.getLogger("bench")

SEED_CHUNK = 5_000
STARTUP_TIMEOUT_SECONDS = 900.0
PUBLISHER_STOP_TIMEOUT_SECONDS = 20.0
PROGRESS_EVERY_SECONDS = 10.0
STARTUP_TIMEOUT_WARNING = "start-up replay not finished within"
"""What the service logs when it starts deciding before its replay is done."""
P99_TARGET_SECONDS = 2.0
RATE_TOLERANCE = 0.03
"""Achieved may fall this fraction short of offered (NodeMetrics straddling the period's edges)."""
BACKLOG_TARGET_SECONDS = 2.0
"""A backlog at the end worth more than this much of the offered rate, and larger than at the start, is growing."""


class _DecisionHead(msgspec.Struct, frozen=True):
    """The fields of a NodeResourceComputed the benchmark reads (the rest is skipped while decoding)."""

    node: str
    computed_at: float
    trigger: tuple[str, ...]
    write_due: bool


_DECISION_DECODER = msgspec.json.Decoder(_DecisionHead)


@dataclass
class DecisionTally:
    """Decisions seen on KOORD_NODERESOURCE since the observer started, and NodeMetric → decision latencies."""

    decisions: int = 0
    writes_due: int = 0
    latencies: list[float] = field(default_factory=list)

    def observe(self, data: bytes, stored_at: float) -> None:
        head = _DECISION_DECODER.decode(data)
        self.decisions += 1
        self.writes_due += head.write_due
        if head.trigger == ("nodemetric",):
            self.latencies.append(stored_at - head.computed_at)


@dataclass(frozen=True)
class Snapshot:
    """Everything read at one instant."""

    at: float
    procs: list[measure.ProcSample]
    """One per replica."""
    sent: dict[str, float]
    consumed: int
    backlog: int
    decisions: int
    writes_due: int
    latencies_seen: int

    @property
    def cpu_seconds(self) -> float:
        return sum(p.cpu_seconds for p in self.procs)


def parse_args(
    argv: list[str] | None = None,
    parser: argparse.ArgumentParser | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> argparse.Namespace:
    """This benchmark's arguments; bench/scale.py passes a `parser` of its own (its name and description) and its
    own `defaults`, and gets the same flags."""
    p = parser or argparse.ArgumentParser(
        prog="python bench/noderesource.py",
        description="Seed N nodes × P pods and the colocation ConfigMap into a real nats-server, start the "
        "noderesource service (its own process, pinned to one CPU), offer one NodeMetric per node per interval "
        "and print one JSON line: NodeMetrics offered/achieved per second, decisions published and writes due "
        "(after hysteresis) per second, NodeMetric → decision latency p50/p99, service CPU and peak RSS, start-up "
        "replay seconds, backlog and whether the target held (achieved ≈ offered, backlog not growing, p99 < 2 s).",
    )
    p.add_argument("--nodes", type=int, default=10_000, help="simulated nodes (10000)")
    p.add_argument("--pods", type=int, default=100, help="pods per node (100: ~70%% prod, 20%% batch, 10%% pending)")
    p.add_argument(
        "--metric-interval",
        type=float,
        default=12.0,
        help="seconds between a node's NodeMetrics (12: 5× the default report rate of one a minute)",
    )
    p.add_argument("--duration", type=float, default=120.0, help="measured seconds, after the warm-up (120)")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds of load excluded from the figures (30)")
    p.add_argument(
        "--database-url",
        help="the service's database, where it projects decisions (default: SQLite in the temporary directory)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (NATS store, logs, SQLite)")
    p.add_argument(
        "--service-cpu",
        type=int,
        default=max(os.sched_getaffinity(0)),
        help="CPU the service process is pinned to; the rest of the benchmark avoids it (default: the last CPU)",
    )
    p.add_argument(
        "--replicas",
        type=int,
        default=1,
        help="noderesource processes (1); more than one get instance names and split the node partitions, each "
        "pinned to its own CPU: --service-cpu, then the other CPUs from the highest down (the load shares those)",
    )
    p.set_defaults(**(defaults or {}))
    args = p.parse_args(argv)
    if min(args.nodes, args.pods, args.replicas) < 1:
        p.error("--nodes, --pods and --replicas must be at least 1")
    if args.replicas > len(os.sched_getaffinity(0)):
        p.error(f"--replicas {args.replicas}: only {len(os.sched_getaffinity(0))} CPUs to pin them to")
    if args.metric_interval <= 0 or args.duration <= 0 or args.warmup < 0:
        p.error("--metric-interval and --duration must be positive, --warmup not negative")
    if args.service_cpu not in os.sched_getaffinity(0):
        p.error(f"--service-cpu {args.service_cpu} is not one of this process's CPUs {sorted(os.sched_getaffinity(0))}")
    args.cpus = sorted(os.sched_getaffinity(0))  # before the benchmark keeps itself off --service-cpu
    return args


def command_line(args: argparse.Namespace) -> str:
    parts = ["python", "bench/noderesource.py", "--nodes", str(args.nodes), "--pods", str(args.pods)]
    parts += ["--metric-interval", f"{args.metric_interval:g}", "--duration", f"{args.duration:g}"]
    parts += ["--warmup", f"{args.warmup:g}", "--service-cpu", str(args.service_cpu)]
    if args.replicas > 1:
        parts += ["--replicas", str(args.replicas)]
    if args.database_url:
        parts += ["--database-url", args.database_url]
    return shlex.join(parts)


@contextlib.contextmanager
def publisher_process(
    ctx: SpawnContext, config: cluster_load.PublisherConfig
) -> Iterator[cluster_load.PublisherCounters]:
    stop = ctx.Event()
    counters = cluster_load.PublisherCounters(ctx)
    process: SpawnProcess = ctx.Process(
        target=cluster_load.run_metric_publisher, args=(config, counters, stop), name="nodemetric-publisher"
    )
    process.start()
    try:
        yield counters
    finally:
        stop.set()
        process.join(timeout=PUBLISHER_STOP_TIMEOUT_SECONDS)
        if process.is_alive():
            log.warning("the NodeMetric publisher did not stop: terminating it")
            process.terminate()
            process.join()


async def seed(bus: JetStreamBus, *, nodes: int, pods: int) -> float:
    """Publish the cluster and one NodeMetric per node before the service starts; the seconds it took."""
    started = time.monotonic()
    now = time.time()
    chunk: list[cluster_load.Message] = []
    sent = 0
    for message in cluster_load.cluster_messages(nodes, pods, at=now):
        chunk.append(message)
        if len(chunk) >= SEED_CHUNK:
            await bus.publish_many(chunk)
            sent += len(chunk)
            chunk = []
            if sent % (20 * SEED_CHUNK) == 0:
                log.info("seeded %d cluster objects", sent)
    for n in range(nodes):
        template = cluster_load.NodeMetricTemplate(n, pods)
        chunk.append(cluster_load.nodemetric_message(template, cluster_load.DriftingLoad(seed=n).level, at=now))
        if len(chunk) >= SEED_CHUNK:
            await bus.publish_many(chunk)
            chunk = []
    if chunk:
        await bus.publish_many(chunk)
    return time.monotonic() - started


async def wait_for_startup(
    bus: JetStreamBus, services: list[tuple[subprocess.Popen[bytes], Path]], *, nodes: int, instances: list[str]
) -> None:
    """Until the services' cluster and NodeMetric consumers have acknowledged everything seeded and every node has a
    first decision on KOORD_NODERESOURCE; replicas must also have split the node partitions. (A replay longer than
    the service's startup_timeout_seconds makes it decide before the replay is done; the replay counts as done only
    once the consumers are drained too.)"""
    deadline = time.monotonic() + STARTUP_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        for process, log_path in services:
            if process.poll() is not None:
                raise RuntimeError(f"a service exited during start-up:\n{processes.tail(log_path)}")
        with contextlib.suppress(Exception):  # the stream and the consumers appear once the service made them
            messages, _ = await bus.stream_info(streams.KOORD_NODERESOURCE)
            split = len(instances) == 1 or await partitions_split(bus, instances)
            if messages >= nodes and split and await replay_left(bus, instances) == 0:
                return
        await asyncio.sleep(0.2)
    raise RuntimeError(
        f"no decision for every node within {STARTUP_TIMEOUT_SECONDS:.0f} s:\n{processes.tail(services[0][1])}"
    )


async def partitions_split(bus: JetStreamBus, instances: list[str]) -> bool:
    """Whether the replicas' NodeMetric consumers filter on every partition between them, each on a share."""
    owned = []
    for instance in instances:
        info = await bus.jetstream.consumer_info(
            streams.KOORD_NODEMETRIC, membership.durable(NODEMETRIC_CONSUMER, instance)
        )
        owned.append(len(info.config.filter_subjects or [info.config.filter_subject]))
    return sum(owned) == subjects.NODE_PARTITIONS and all(owned)


async def replay_left(bus: JetStreamBus, instances: list[str]) -> int:
    """Cluster and NodeMetric messages the services have not acknowledged yet."""
    left = 0
    consumers = ((streams.KOORD_CLUSTER, CLUSTER_CONSUMER), (streams.KOORD_NODEMETRIC, NODEMETRIC_CONSUMER))
    for instance in instances:
        for stream, name in consumers:
            info = await bus.jetstream.consumer_info(stream, membership.durable(name, instance))
            left += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
    return left


async def observe_decisions(bus: JetStreamBus, tally: DecisionTally) -> Any:
    """Follow new decisions on KOORD_NODERESOURCE (an ordered consumer) into `tally`; the subscription."""

    async def on_message(msg: Msg) -> None:
        stored = msg.metadata.timestamp
        tally.observe(msg.data, stored.timestamp() if isinstance(stored, datetime.datetime) else time.time())

    return await bus.jetstream.subscribe(
        subjects.NODERESOURCE_COMPUTED_ALL,
        cb=on_message,
        ordered_consumer=True,
        deliver_policy=DeliverPolicy.NEW,
        pending_msgs_limit=-1,
        pending_bytes_limit=-1,
    )


async def consumer_state(bus: JetStreamBus, instances: list[str]) -> tuple[int, int]:
    """(NodeMetrics the services acknowledged so far, NodeMetrics not yet delivered or not yet acknowledged)."""
    acked = left = 0
    for instance in instances:
        durable = membership.durable(NODEMETRIC_CONSUMER, instance)
        info = await bus.jetstream.consumer_info(streams.KOORD_NODEMETRIC, durable)
        acked += int(info.ack_floor.consumer_seq or 0) if info.ack_floor is not None else 0
        left += int(info.num_pending or 0) + int(info.num_ack_pending or 0)
    return acked, left


async def snapshot(
    bus: JetStreamBus,
    *,
    pids: list[int],
    instances: list[str],
    counters: cluster_load.PublisherCounters,
    tally: DecisionTally,
    reset_lag: bool = False,
) -> Snapshot:
    consumed, backlog = await consumer_state(bus, instances)
    return Snapshot(
        at=time.monotonic(),
        procs=[measure.read_proc(pid) for pid in pids],
        sent=counters.read(reset_lag=reset_lag),
        consumed=consumed,
        backlog=backlog,
        decisions=tally.decisions,
        writes_due=tally.writes_due,
        latencies_seen=len(tally.latencies),
    )


async def measured_period(
    bus: JetStreamBus,
    *,
    args: argparse.Namespace,
    pids: list[int],
    instances: list[str],
    counters: cluster_load.PublisherCounters,
    tally: DecisionTally,
) -> tuple[Snapshot, Snapshot]:
    log.info("NodeMetrics are flowing; warming up for %g s", args.warmup)
    await processes.pause(args.warmup)
    first = await snapshot(bus, pids=pids, instances=instances, counters=counters, tally=tally, reset_lag=True)
    log.info("measuring for %g s (backlog %d)", args.duration, first.backlog)
    end = first.at + args.duration
    previous = first
    while (left := end - time.monotonic()) > 0:
        await processes.pause(min(left, PROGRESS_EVERY_SECONDS))
        current = await snapshot(bus, pids=pids, instances=instances, counters=counters, tally=tally)
        seconds = current.at - previous.at
        log.info(
            "NodeMetrics sent %.0f/s, consumed %.0f/s; decisions %.0f/s, writes due %.1f/s; backlog %d; "
            "service CPU %.2f, RSS %.0f MiB",
            measure.rate(current.sent["published"], previous.sent["published"], seconds),
            measure.rate(current.consumed, previous.consumed, seconds),
            measure.rate(current.decisions, previous.decisions, seconds),
            measure.rate(current.writes_due, previous.writes_due, seconds),
            current.backlog,
            measure.rate(current.cpu_seconds, previous.cpu_seconds, seconds),
            sum(p.rss_bytes for p in current.procs) / 2**20,
        )
        previous = current
    return first, previous


def quantile(q: float, values: list[float]) -> float | None:
    """The q-quantile by the nearest rank, or None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(int(q * len(ordered)), len(ordered) - 1)]


def misses(
    *, offered: float, published: float, consumed: float, p99: float | None, backlog: tuple[int, int], errors: int
) -> list[str]:
    """Why the target was not held; empty when it was."""
    out: list[str] = []
    floor = offered * (1 - RATE_TOLERANCE)
    if published < floor:
        out.append(f"publisher sent {published:.1f}/s of {offered:.1f}/s offered")
    if consumed < floor:
        out.append(f"service consumed {consumed:.1f}/s of {offered:.1f}/s offered")
    if errors:
        out.append(f"{errors} publishes failed")
    if p99 is None:
        out.append("no NodeMetric-triggered decision in the measured period")
    elif p99 >= P99_TARGET_SECONDS:
        out.append(f"p99 {p99:.3f} s >= {P99_TARGET_SECONDS} s")
    start, end = backlog
    if end > max(start, offered * BACKLOG_TARGET_SECONDS):
        out.append(f"backlog grew from {start} to {end} NodeMetrics")
    return out


def result(
    args: argparse.Namespace,
    first: Snapshot,
    last: Snapshot,
    tally: DecisionTally,
    *,
    seed_seconds: float,
    startup_seconds: float,
    startup_timed_out: bool,
) -> dict[str, Any]:
    seconds = last.at - first.at
    offered = args.nodes / args.metric_interval
    published = measure.rate(last.sent["published"], first.sent["published"], seconds)
    consumed = measure.rate(last.consumed, first.consumed, seconds)
    latencies = tally.latencies[first.latencies_seen : last.latencies_seen]
    p50, p99 = quantile(0.5, latencies), quantile(0.99, latencies)
    errors = int(last.sent["errors"] - first.sent["errors"])
    why = misses(
        offered=offered,
        published=published,
        consumed=consumed,
        p99=p99,
        backlog=(first.backlog, last.backlog),
        errors=errors,
    )
    return {
        "bench": "noderesource",
        "nodes": args.nodes,
        "pods": args.pods,
        "metric_interval_s": args.metric_interval,
        "duration_s": round(seconds, 3),
        "offered_nodemetrics_per_s": round(offered, 3),
        "published_nodemetrics_per_s": round(published, 3),
        # NodeMetrics the service's consumer acknowledged (each decided with its fetched batch).
        "achieved_nodemetrics_per_s": round(consumed, 3),
        "decisions_per_s": round(measure.rate(last.decisions, first.decisions, seconds), 3),
        # Published decisions whose node write is due: the write rate to the API server after hysteresis.
        "writes_due_per_s": round(measure.rate(last.writes_due, first.writes_due, seconds), 3),
        "latency_p50_s": None if p50 is None else round(p50, 4),
        "latency_p99_s": None if p99 is None else round(p99, 4),
        "latency_max_s": round(max(latencies), 4) if latencies else None,
        "latency_samples": len(latencies),
        # With replicas: their CPU added up, the largest peak, their RSS added up at the end.
        "service_cpu_cores": round(measure.rate(last.cpu_seconds, first.cpu_seconds, seconds), 3),
        "service_rss_peak_mb": round(max(p.rss_peak_bytes for p in last.procs) / 2**20, 1),
        "service_rss_end_mb": round(sum(p.rss_bytes for p in last.procs) / 2**20, 1),
        "replicas": args.replicas,
        "replica_cpus": processes.replica_cpus(args.service_cpu, args.cpus, args.replicas),
        "replica_cpu_cores": [
            round(measure.rate(b.cpu_seconds, a.cpu_seconds, seconds), 3)
            for a, b in zip(first.procs, last.procs, strict=True)
        ],
        "replica_rss_peak_mb": [round(p.rss_peak_bytes / 2**20, 1) for p in last.procs],
        "seed_s": round(seed_seconds, 3),
        # Service spawn → a first decision for every node stored (imports, replay of cluster and NodeMetrics).
        "startup_replay_s": round(startup_seconds, 3),
        # The replay outlasted the service's startup_timeout_seconds: it decided before it had the whole cluster.
        "startup_replay_timed_out": startup_timed_out,
        "backlog_start": first.backlog,
        "backlog_end": last.backlog,
        "publish_errors": errors,
        "publisher_lag_max_s": round(last.sent["lag_max_s"], 3),
        "target_held": not why,
        "target_misses": why,
        "command": command_line(args),
    }


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    async with EmbeddedNatsServer(workdir / "nats", log_file=workdir / "nats-server.log") as server:
        log.info("nats-server at %s; data in %s", server.url, workdir)
        bus = await JetStreamBus.connect(server.url, name="bench")
        try:
            await bus.ensure_streams(streams.all_streams())
            log.info("seeding %d nodes × %d pods, the ConfigMap and a NodeMetric per node", args.nodes, args.pods)
            seed_seconds = await seed(bus, nodes=args.nodes, pods=args.pods)
            log.info("seeded in %.1f s; starting the service", seed_seconds)
            spawned = time.monotonic()
            database_url = args.database_url or f"sqlite:///{workdir / 'bench.db'}"
            arguments = ["noderesource", "--nats-url", server.url, "--database-url", database_url, "--port", "0"]
            instances = processes.replica_instances(args.replicas)
            cpus = processes.replica_cpus(args.service_cpu, args.cpus, args.replicas)
            with contextlib.ExitStack() as stack:
                services: list[tuple[subprocess.Popen[bytes], Path]] = []
                for instance, cpu in zip(instances, cpus, strict=True):
                    service_log = workdir / ("service.log" if not instance else f"service-{instance}.log")
                    env = {"KOORDBUS_INSTANCE": instance} if instance else None
                    service = stack.enter_context(
                        processes.pinned_service(arguments, cpu=cpu, log_path=service_log, env=env)
                    )
                    services.append((service, service_log))
                await wait_for_startup(bus, services, nodes=args.nodes, instances=instances)
                startup_seconds = time.monotonic() - spawned
                startup_timed_out = any(
                    STARTUP_TIMEOUT_WARNING in service_log.read_text(errors="replace") for _, service_log in services
                )
                pids = [service.pid for service, _ in services]
                for pid, cpu in zip(pids, cpus, strict=True):
                    log.info(
                        "service pid %d on CPU %d decided every node %.1f s after its start (RSS %.0f MiB)",
                        pid,
                        cpu,
                        startup_seconds,
                        measure.read_proc(pid).rss_bytes / 2**20,
                    )
                tally = DecisionTally()
                subscription = await observe_decisions(bus, tally)
                config = cluster_load.PublisherConfig(
                    nats_url=server.url, nodes=args.nodes, pods=args.pods, interval=args.metric_interval
                )
                try:
                    with publisher_process(multiprocessing.get_context("spawn"), config) as counters:
                        first, last = await measured_period(
                            bus, args=args, pids=pids, instances=instances, counters=counters, tally=tally
                        )
                finally:
                    await subscription.unsubscribe()
                for service, service_log in services:
                    if service.poll() is not None:
                        raise RuntimeError(f"a service died during the run:\n{processes.tail(service_log)}")
        finally:
            await bus.close()
    return result(
        args,
        first,
        last,
        tally,
        seed_seconds=seed_seconds,
        startup_seconds=startup_seconds,
        startup_timed_out=startup_timed_out,
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return processes.run_pinned_bench(args, run)


if __name__ == "__main__":
    sys.exit(main())
