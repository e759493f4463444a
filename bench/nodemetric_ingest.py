"""Ingest benchmark: N simulated nodes × P pods publishing through a real nats-server into the nodemetric service.

Run by `make bench` (`python bench/nodemetric_ingest.py [flags]`, see --help) and, with tiny flags, by
tests/e2e/test_bench_smoke.py. It starts an embedded nats-server and `koordbus service nodemetric` as a separate
process pinned to one CPU (everything else, the nats-server and the load generators of bench.loadgen included,
runs on the other CPUs), offers nodes/interval batches per second, and after a warm-up measures over
--duration seconds: batches and pod samples applied per second (the service's counters), send → applied-and-
committed latency p50/p99 (its histogram), its peak RSS and CPU use (/proc), the ingest backlog and reports
published. Exactly one JSON line goes to stdout; progress goes to stderr. Every process it started is stopped
on the way out, also on Ctrl-C. With --replicas N it starts N nodemetric processes with instance names, each pinned
to a CPU of its own, waits until they have split the node partitions, and reports their figures added up (and each
replica's rate, CPU and RSS); bench/scale.py compares 1 and 2 replicas this way. The batches carry the agents'
training rounds, so the service's prod predictor trains as it does in a cluster; --no-training leaves them out, and
a later run with --baseline <that run's output> reports what the predictor adds to peak RSS and CPU and holds the
target only within issue 22's allowance (1 GiB, 0.2 core).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import multiprocessing
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from multiprocessing.context import SpawnContext, SpawnProcess
from pathlib import Path
from typing import Any, Protocol

if __package__ in (None, ""):  # run as a script (`python bench/nodemetric_ingest.py`): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import loadgen, measure, processes
from bus import streams, subjects
from bus.cluster import free_port
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from services.common import membership
from services.common import settings as settings_loader
from services.nodemetric.service import INGEST_CONSUMER
from services.nodemetric.settings import NodeMetricSettings

log = logging.getLogger("bench")

SERVICE_READY_TIMEOUT_SECONDS = 60.0
GENERATOR_STOP_TIMEOUT_SECONDS = 20.0
PROGRESS_EVERY_SECONDS = 10.0
PREDICTOR_RSS_BYTES = 2**30
"""What issue 22 lets the prod predictor add to the service's peak RSS at 10,000 nodes × 100 pods (1 GB) ..."""
PREDICTOR_CPU_CORES = 0.2
"""... and to its CPU use."""


@dataclass(frozen=True)
class Baseline:
    """The figures of a --no-training run that a run with training is compared with (--baseline)."""

    rss_peak_mb: float
    cpu_cores: float
    command: str

    @classmethod
    def read(cls, path: Path, args: argparse.Namespace) -> Baseline:
        """The JSON line in `path`; ValueError saying why when it is not a --no-training run of this size."""
        try:
            line = json.loads(path.read_text(encoding="utf-8").strip().splitlines()[-1])
            if line.get("bench") != "nodemetric_ingest" or line.get("training") is not False:
                raise ValueError("its JSON line is not one of `python bench/nodemetric_ingest.py --no-training`")
            size = (line["nodes"], line["pods"], line["interval_s"])
            if size != (args.nodes, args.pods, args.interval):
                raise ValueError(
                    f"it ran --nodes {size[0]} --pods {size[1]} --interval {size[2]:g}, this run --nodes "
                    f"{args.nodes} --pods {args.pods} --interval {args.interval:g}"
                )
            return cls(
                rss_peak_mb=float(line["service_rss_peak_mb"]),
                cpu_cores=float(line["service_cpu_cores"]),
                command=str(line["command"]),
            )
        except (OSError, UnicodeDecodeError, IndexError, KeyError, TypeError, AttributeError) as e:
            raise ValueError(f"cannot read its JSON line: {e!r}") from None
        except json.JSONDecodeError as e:
            raise ValueError(f"its last line is not JSON: {e}") from None

    def target(self) -> measure.Target:
        """The ingest target with the RSS bound at this run's peak plus what the predictor may add."""
        return measure.Target(rss_bytes=int(self.rss_peak_mb * 2**20) + PREDICTOR_RSS_BYTES)


@dataclass(frozen=True)
class Replica:
    """One running nodemetric process."""

    instance: str
    """Its KOORDBUS_INSTANCE ("" when it runs alone)."""
    cpu: int
    port: int
    pid: int


@dataclass(frozen=True)
class Snapshot:
    """Everything read at one instant: each replica's metrics and /proc, generator tallies, the ingest backlog."""

    at: float
    replicas: list[measure.ServiceMetrics]
    procs: list[measure.ProcSample]
    sent: list[loadgen.Totals]
    backlog: int

    @property
    def metrics(self) -> measure.ServiceMetrics:
        """The replicas' figures added up."""
        return measure.sum_metrics(self.replicas)

    @property
    def cpu_seconds(self) -> float:
        return sum(p.cpu_seconds for p in self.procs)

    @property
    def published(self) -> int:
        return sum(t.published for t in self.sent)

    @property
    def pod_samples(self) -> int:
        return sum(t.pod_samples for t in self.sent)


def parse_args(
    argv: list[str] | None = None,
    parser: argparse.ArgumentParser | None = None,
    defaults: Mapping[str, Any] | None = None,
) -> argparse.Namespace:
    """This benchmark's arguments; bench/scale.py passes a `parser` of its own (its name and description) and its
    own `defaults`, and gets the same flags."""
    p = parser or argparse.ArgumentParser(
        prog="python bench/nodemetric_ingest.py",
        description="Offer N nodes × P pods of agent batches through a real nats-server to the nodemetric service "
        "(its own process, pinned to one CPU) and print one JSON line: sustained batches/s and pod-samples/s, "
        "send → applied latency p50/p99, peak RSS, CPU use, backlog and whether the target held "
        "(p99 < 2 s, RSS < 2 GiB or, with --baseline, within the predictor's allowance, backlog not growing, "
        "achieved ≈ offered).",
    )
    p.add_argument("--nodes", type=int, default=10_000, help="simulated nodes, each one batch per interval (10000)")
    p.add_argument("--pods", type=int, default=100, help="pods per node (100; ~80%% are running at any time)")
    p.add_argument("--interval", type=float, default=10.0, help="agent publish interval in seconds (10)")
    p.add_argument("--duration", type=float, default=120.0, help="measured seconds, after the warm-up (120)")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds of load excluded from the figures (30)")
    p.add_argument("--database-url", help="the service's database (default: SQLite in the temporary directory)")
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
        help="nodemetric processes (1); more than one get instance names and split the node partitions, each pinned "
        "to its own CPU: --service-cpu, then the other CPUs from the highest down (the load shares those)",
    )
    p.add_argument("--generators", type=int, default=1, help="load-generator processes (1)")
    p.add_argument("--max-in-flight", type=int, default=256, help="unacknowledged publishes per generator (256)")
    p.add_argument("--template-pool", type=int, default=64, help="distinct simulated nodes per window (64)")
    p.add_argument(
        "--no-training",
        dest="training",
        action="store_false",
        help="leave the agents' training rounds out of the batches, so the service's prod predictor trains nothing: "
        "the run to measure the predictor's share against (--baseline)",
    )
    p.add_argument(
        "--baseline",
        type=Path,
        metavar="FILE",
        help="a file whose last line is the JSON line of a --no-training run of the same --nodes, --pods and "
        "--interval: this run then reports the predictor's share (its peak RSS and CPU above that run's) and holds "
        f"the target only if the predictor adds under {PREDICTOR_RSS_BYTES / 2**30:g} GiB and "
        f"{PREDICTOR_CPU_CORES:g} core; the RSS bound becomes the baseline's peak plus "
        f"{PREDICTOR_RSS_BYTES / 2**30:g} GiB instead of 2 GiB",
    )
    p.add_argument(
        "--stream-max-gb",
        type=float,
        default=20.0,
        help="cap on the node stream's disk use in GiB; the oldest batches go first (20: 10,000 nodes write ~25 MB/s)",
    )
    p.set_defaults(**(defaults or {}))
    args = p.parse_args(argv)
    if min(args.nodes, args.pods, args.generators, args.max_in_flight, args.template_pool, args.replicas) < 1:
        p.error("--nodes, --pods, --generators, --max-in-flight, --template-pool and --replicas must be at least 1")
    if args.replicas > len(os.sched_getaffinity(0)):
        p.error(f"--replicas {args.replicas}: only {len(os.sched_getaffinity(0))} CPUs to pin them to")
    if args.interval <= 0 or args.duration <= 0 or args.warmup < 0 or args.stream_max_gb <= 0:
        p.error("--interval, --duration and --stream-max-gb must be positive, --warmup not negative")
    if args.service_cpu not in os.sched_getaffinity(0):
        p.error(f"--service-cpu {args.service_cpu} is not one of this process's CPUs {sorted(os.sched_getaffinity(0))}")
    if args.baseline is not None:
        if not args.training:
            p.error("--baseline compares a run with training with one without: not with --no-training")
        try:
            args.baseline_figures = Baseline.read(args.baseline, args)
        except ValueError as e:
            p.error(f"--baseline {args.baseline}: {e}")
    else:
        args.baseline_figures = None
    args.cpus = sorted(os.sched_getaffinity(0))  # before the benchmark keeps itself off --service-cpu
    return args


def command_line(args: argparse.Namespace) -> str:
    """The invocation that reproduces this run (the database URL only when one was given)."""
    parts = ["python", "bench/nodemetric_ingest.py", "--nodes", str(args.nodes), "--pods", str(args.pods)]
    parts += ["--interval", f"{args.interval:g}", "--duration", f"{args.duration:g}", "--warmup", f"{args.warmup:g}"]
    parts += ["--service-cpu", str(args.service_cpu), "--generators", str(args.generators)]
    if args.replicas > 1:
        parts += ["--replicas", str(args.replicas)]
    if not args.training:
        parts += ["--no-training"]
    if args.baseline is not None:
        parts += ["--baseline", str(args.baseline)]
    if args.database_url:
        parts += ["--database-url", args.database_url]
    return shlex.join(parts)


@contextlib.contextmanager
def generator_processes(ctx: SpawnContext, configs: list[loadgen.GeneratorConfig]) -> Iterator[list[loadgen.Counters]]:
    """Start one process per config; on exit ask them to stop, wait, and terminate any that hang."""
    stop = ctx.Event()
    counters = [loadgen.Counters(ctx) for _ in configs]
    generators: list[SpawnProcess] = []
    try:
        for config, tally in zip(configs, counters, strict=True):
            process = ctx.Process(target=loadgen.run_generator, args=(config, tally, stop), name=f"gen-{config.index}")
            process.start()
            generators.append(process)
        yield counters
    finally:
        stop.set()
        deadline = time.monotonic() + GENERATOR_STOP_TIMEOUT_SECONDS
        for process in generators:
            process.join(timeout=max(deadline - time.monotonic(), 0.1))
            if process.is_alive():
                log.warning("generator %s did not stop: terminating it", process.name)
                process.terminate()
                process.join()


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        return str(response.read().decode())


async def wait_for_service(port: int, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + SERVICE_READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the service exited during start-up:\n{processes.tail(log_path)}")
        with contextlib.suppress(OSError):
            measure.parse_metrics(await asyncio.to_thread(scrape, port))
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the service did not serve /metrics within {SERVICE_READY_TIMEOUT_SECONDS:.0f} s")


async def wait_for_split(replicas: list[Replica]) -> None:
    """Until the replicas own every node partition between them, each a share (they join within a heartbeat or
    two, each first owning everything until it hears of the others)."""
    deadline = time.monotonic() + SERVICE_READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        owned = [measure.parse_metrics(await asyncio.to_thread(scrape, r.port)).owned_partitions for r in replicas]
        if sum(owned) == subjects.NODE_PARTITIONS and all(owned):
            log.info("the replicas split the %d partitions %s", subjects.NODE_PARTITIONS, owned)
            return
        await asyncio.sleep(0.5)
    raise RuntimeError(f"the replicas did not split the partitions within {SERVICE_READY_TIMEOUT_SECONDS:.0f} s")


async def ingest_backlog(bus: JetStreamBus, replicas: list[Replica]) -> int:
    """Messages the replicas' ingest consumers have not been delivered yet."""
    backlog = 0
    for replica in replicas:
        durable = membership.durable(INGEST_CONSUMER, replica.instance)
        info = await bus.jetstream.consumer_info(streams.KOORD_NODE, durable)
        backlog += int(info.num_pending or 0)
    return backlog


async def snapshot(
    bus: JetStreamBus, *, replicas: list[Replica], counters: list[loadgen.Counters], reset_lag: bool = False
) -> Snapshot:
    texts = [await asyncio.to_thread(scrape, r.port) for r in replicas]
    return Snapshot(
        at=time.monotonic(),
        replicas=[measure.parse_metrics(text) for text in texts],
        procs=[measure.read_proc(r.pid) for r in replicas],
        sent=[c.totals(reset_lag=reset_lag) for c in counters],
        backlog=await ingest_backlog(bus, replicas),
    )


async def wait_for_first_publishes(counters: list[loadgen.Counters], interval: float) -> None:
    """Generators start at the next window boundary; wait until every one has had a batch acknowledged."""
    deadline = time.monotonic() + interval + SERVICE_READY_TIMEOUT_SECONDS
    while not all(c.totals().started for c in counters):
        if time.monotonic() > deadline:
            raise RuntimeError("the load generators published nothing (see their messages above)")
        await asyncio.sleep(0.1)


async def measured_period(
    bus: JetStreamBus, *, args: argparse.Namespace, replicas: list[Replica], counters: list[loadgen.Counters]
) -> tuple[Snapshot, Snapshot]:
    """Warm up, then take the snapshots that bound the measured period, logging progress in between."""
    log.info("load is flowing; warming up for %g s", args.warmup)
    await processes.pause(args.warmup)
    first = await snapshot(bus, replicas=replicas, counters=counters, reset_lag=True)
    log.info("measuring for %g s (backlog %d)", args.duration, first.backlog)
    end = first.at + args.duration
    previous = first
    while (left := end - time.monotonic()) > 0:
        await processes.pause(min(left, PROGRESS_EVERY_SECONDS))
        current = await snapshot(bus, replicas=replicas, counters=counters)
        seconds = current.at - previous.at
        log.info(
            "applied %.0f/s, sent %.0f/s, backlog %d, service CPU %.2f, RSS %.0f MiB",
            measure.rate(current.metrics.batches, previous.metrics.batches, seconds),
            measure.rate(current.published, previous.published, seconds),
            current.backlog,
            measure.rate(current.cpu_seconds, previous.cpu_seconds, seconds),
            sum(p.rss_bytes for p in current.procs) / 2**20,
        )
        previous = current
    return first, previous


def result(args: argparse.Namespace, first: Snapshot, last: Snapshot, *, load_seconds: float) -> dict[str, Any]:
    """The JSON line: figures over the measured period between two snapshots."""
    seconds = last.at - first.at
    offered = args.nodes / args.interval
    applied = measure.rate(last.metrics.batches, first.metrics.batches, seconds)
    published = last.published - first.published
    samples_per_batch = (last.pod_samples - first.pod_samples) / published if published else 0.0
    latency = measure.bucket_deltas(last.metrics.latency, first.metrics.latency)
    p50, p99 = measure.histogram_quantile(0.5, latency), measure.histogram_quantile(0.99, latency)
    projection = measure.bucket_deltas(last.metrics.projection_latency, first.metrics.projection_latency)
    proj_p50, proj_p99 = measure.histogram_quantile(0.5, projection), measure.histogram_quantile(0.99, projection)
    errors = sum(t.errors for t in last.sent) - sum(t.errors for t in first.sent)
    rss_peak = max(p.rss_peak_bytes for p in last.procs)  # the target is per process
    outcome = measure.Outcome(
        offered_per_s=offered,
        published_per_s=published / seconds,
        applied_per_s=applied,
        latency_p99_s=p99,
        projection_latency_p99_s=proj_p99,
        rss_peak_bytes=rss_peak,
        backlog_start=first.backlog,
        backlog_end=last.backlog,
        publish_errors=errors,
    )
    baseline: Baseline | None = args.baseline_figures
    misses = measure.misses(outcome, baseline.target() if baseline else measure.Target())
    cpu_cores = measure.rate(last.cpu_seconds, first.cpu_seconds, seconds)
    predictor_rss_mb = predictor_cpu_cores = None
    if baseline is not None:
        predictor_rss_mb = round(rss_peak / 2**20 - baseline.rss_peak_mb, 1)
        predictor_cpu_cores = round(cpu_cores - baseline.cpu_cores, 3)
        if predictor_cpu_cores > PREDICTOR_CPU_CORES:
            misses.append(f"the predictor added {predictor_cpu_cores:.3f} core > {PREDICTOR_CPU_CORES:g} core")
    nm = settings_loader.load(NodeMetricSettings)
    retention = max(*nm.aggregate_durations_seconds, nm.aggregate_duration_seconds) + nm.report_interval_seconds
    return {
        "bench": "nodemetric_ingest",
        "nodes": args.nodes,
        "pods": args.pods,
        "interval_s": args.interval,
        "duration_s": round(seconds, 3),
        "offered_batches_per_s": round(offered, 3),
        "published_batches_per_s": round(outcome.published_per_s, 3),
        "batches_per_s": round(applied, 3),
        "pod_samples_per_s": round(applied * samples_per_batch, 1),
        "pod_samples_per_batch": round(samples_per_batch, 1),
        "latency_p50_s": None if p50 is None else round(p50, 4),
        "latency_p99_s": None if p99 is None else round(p99, 4),
        # Above the top bucket (30 s) the quantiles are floors, not values.
        "latency_above_top_bucket": round(measure.fraction_above_top_bucket(latency), 4),
        # Per report: the agent's send time of the batch that completed it → its NodeMetric row committed.
        "projection_latency_p50_s": None if proj_p50 is None else round(proj_p50, 4),
        "projection_latency_p99_s": None if proj_p99 is None else round(proj_p99, 4),
        # With replicas: the largest peak, their RSS added up at the end, their CPU added up.
        "service_rss_peak_mb": round(rss_peak / 2**20, 1),
        "service_rss_end_mb": round(sum(p.rss_bytes for p in last.procs) / 2**20, 1),
        "service_cpu_cores": round(cpu_cores, 3),
        # Whether the batches carried training rounds; with --baseline, the peak RSS and CPU above that run's.
        "training": args.training,
        "predictor_rss_mb": predictor_rss_mb,
        "predictor_cpu_cores": predictor_cpu_cores,
        "baseline_command": baseline.command if baseline else None,
        "replicas": len(last.procs),
        "replica_cpus": processes.replica_cpus(args.service_cpu, args.cpus, args.replicas),
        "replica_batches_per_s": [
            round(measure.rate(b.batches, a.batches, seconds), 3)
            for a, b in zip(first.replicas, last.replicas, strict=True)
        ],
        "replica_cpu_cores": [
            round(measure.rate(b.cpu_seconds, a.cpu_seconds, seconds), 3)
            for a, b in zip(first.procs, last.procs, strict=True)
        ],
        "replica_rss_peak_mb": [round(p.rss_peak_bytes / 2**20, 1) for p in last.procs],
        "replica_partitions": [int(m.owned_partitions) for m in last.replicas],
        "backlog_start": first.backlog,
        "backlog_end": last.backlog,
        "reports": int(last.metrics.reports - first.metrics.reports),
        "publish_errors": errors,
        "generator_lag_max_s": round(max(t.lag_max_s for t in last.sent), 3),
        # The service keeps up to `retention` s per node; RSS is steady only once the windows are that full.
        "window_fill": round(min(load_seconds / retention, 1.0), 3),
        "target_held": not misses,
        "target_misses": misses,
        "command": command_line(args),
    }


class NatsEndpoint(Protocol):
    @property
    def url(self) -> str: ...


def embedded_nats(workdir: Path) -> contextlib.AbstractAsyncContextManager[NatsEndpoint]:
    return EmbeddedNatsServer(workdir / "nats", log_file=workdir / "nats-server.log")


async def run(
    args: argparse.Namespace,
    workdir: Path,
    *,
    nats: Callable[[Path], contextlib.AbstractAsyncContextManager[NatsEndpoint]] = embedded_nats,
    stream_replicas: int = 1,
) -> dict[str, Any]:
    """The benchmark on the NATS `nats(workdir)` starts (one embedded nats-server; bench/cluster.py passes a
    cluster), its streams at `stream_replicas`."""
    database_url = args.database_url or f"sqlite:///{workdir / 'bench.db'}"
    async with nats(workdir) as server:
        log.info("nats-server at %s; data in %s", server.url, workdir)
        bus = await JetStreamBus.connect(server.url, name="bench")
        try:
            node_stream = streams.node_stream(max_bytes=int(args.stream_max_gb * 2**30), replicas=stream_replicas)
            await bus.ensure_streams(
                [
                    node_stream,
                    streams.nodemetric_stream(replicas=stream_replicas),
                    streams.dlq_stream(replicas=stream_replicas),
                    streams.members_stream(replicas=stream_replicas),
                ]
            )
            with contextlib.ExitStack() as stack:
                replicas: list[Replica] = []
                started: list[tuple[subprocess.Popen[bytes], Path]] = []
                cpus = processes.replica_cpus(args.service_cpu, args.cpus, args.replicas)
                for instance, cpu in zip(processes.replica_instances(args.replicas), cpus, strict=True):
                    port = free_port()
                    arguments = ["nodemetric", "--nats-url", server.url, "--database-url", database_url]
                    service_log = workdir / ("service.log" if not instance else f"service-{instance}.log")
                    service = stack.enter_context(
                        processes.pinned_service(
                            [*arguments, "--port", str(port)],
                            cpu=cpu,
                            log_path=service_log,
                            env={"KOORDBUS_STREAM_REPLICAS": str(stream_replicas)}
                            | ({"KOORDBUS_INSTANCE": instance} if instance else {}),
                        )
                    )
                    await wait_for_service(port, service, service_log)
                    replicas.append(Replica(instance=instance, cpu=cpu, port=port, pid=service.pid))
                    started.append((service, service_log))
                    log.info("service pid %d on CPU %d, /metrics on port %d", service.pid, cpu, port)
                if len(replicas) > 1:
                    await wait_for_split(replicas)
                configs = [
                    loadgen.GeneratorConfig(
                        index=i,
                        generators=args.generators,
                        nats_url=server.url,
                        nodes=args.nodes,
                        pods=args.pods,
                        interval=args.interval,
                        pool_size=args.template_pool,
                        max_in_flight=args.max_in_flight,
                        training=args.training,
                    )
                    for i in range(args.generators)
                ]
                with generator_processes(multiprocessing.get_context("spawn"), configs) as counters:
                    await wait_for_first_publishes(counters, args.interval)
                    load_started = time.monotonic()
                    first, last = await measured_period(bus, args=args, replicas=replicas, counters=counters)
                    load_seconds = last.at - load_started
                for service, service_log in started:
                    if service.poll() is not None:
                        raise RuntimeError(f"a service died during the run:\n{processes.tail(service_log)}")
        finally:
            await bus.close()
    return result(args, first, last, load_seconds=load_seconds)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    return processes.run_pinned_bench(args, run)


if __name__ == "__main__":
    sys.exit(main())
