"""NodeMetric percentiles, koordbus vs Prometheus: the same N nodes' 1 s usage samples into both, side by side.

Run as `python bench/compare_prometheus.py [flags]` (see --help; needs /usr/bin/prometheus, the Debian package
`prometheus` — without it the bench prints the install command and exits 2, it never installs anything) and, at
toy size, by tests/e2e/test_bench_prometheus_smoke.py.

What runs: an embedded nats-server, `koordbus service nodemetric` and Prometheus (each pinned to a CPU — by
default the service and Prometheus share the last CPU, everything else stays off it), bench.loadgen's generators
sending every node's NodeMetricsReported batch each agent interval (10 s of 1 s samples, 100 pods), and
bench/node_exporter.py serving the same nodes' node CPU and memory (template node i mod 64, same windows and
seed) for Prometheus to scrape every second. Prometheus records `quantile_over_time(0.5|0.9|0.95|0.99, …[5m|10m|
30m])` of both series every --report-interval seconds, the cadence at which koordbus computes each node's NodeMetric.

What is reported, over the measured period after --warmup: CPU seconds and peak RSS of the nodemetric service,
of nats-server (separately) and of Prometheus (its exporter's CPU separately: it stands for node exporters, as the
load generators stand for agents); and freshness, newest sample included → result visible, p50/p99:
  koordbus: per NodeMetricComputed, its time in the KOORD_NODEMETRIC stream − its newest sample (report time − 1 s),
    read back from the stream afterwards; the service's own send → applied and send → row committed histograms too.
  Prometheus: per node and rule round, the moment the round's last rule output is first seen by polling its HTTP
    query API (every 0.2 s) − that node's newest scrape at the evaluation time (`timestamp()` queried at it).

What is not equal: koordbus computes the whole NodeMetric status (node and system usage avg over 5 min, the
percentiles, every pod's average, the memory policy), stores every batch durably in JetStream (nats-server's CPU)
and writes NodeMetric rows to its database; this Prometheus setup records only the 24 node quantile series (no pod-
or system-level aggregation) and keeps its TSDB on local disk. koordbus's freshness includes the agents' batching
(a sample waits up to one agent interval, plus the node's spread, before it is sent: reported as
`batching_p50_s`/`_p99_s`); Prometheus scrapes every second but evaluates every report interval on a fixed grid,
whereas koordbus reports each node when its batch crosses the node's report time. Percentiles differ in method
(koordbus: Koordinator's nearest rank; Prometheus: interpolated). Both windows fill for 30 min: a shorter run
measures both with partial windows (`window_fill`). Cold start differs: koordbus leaves a duration's percentiles
empty until its samples span half of it (as Koordinator does), so before 15 min it skips the 30 min percentiles,
while Prometheus computes every rule over whatever samples it has. `cross_check` compares one node's 5 min CPU
average and p95 from both at the same instant, to show they computed over the same data.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import multiprocessing
import os
import shlex
import sys
import time
import urllib.parse
import urllib.request
from dataclasses import dataclass
from multiprocessing.context import SpawnContext
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script (`python bench/compare_prometheus.py`): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import msgspec

from agent.simulate import simulated_node_names
from bench import loadgen, measure, node_exporter, nodemetric_ingest, processes, promsetup
from bus import streams, subjects
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer
from schemas.node import NODE_EVENT_DECODER, NodeMetricComputed, NodeMetricComputedRecord
from services.common import settings as settings_loader
from services.nodemetric.settings import NodeMetricSettings

log = logging.getLogger("bench")

PROMETHEUS = Path("/usr/bin/prometheus")
INSTALL_COMMAND = "apt-get install -y prometheus"
READY_TIMEOUT_SECONDS = 60.0
POLL_SECONDS = 0.2
PROGRESS_EVERY_SECONDS = 15.0
SAMPLE_STEP_SECONDS = 1.0
"""The agents sample every second: a report at time T holds samples up to T − 1 s."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python bench/compare_prometheus.py",
        description="Feed the same N simulated nodes' 1 s usage samples to koordbus's nodemetric service (through a "
        "real nats-server) and to Prometheus (scraping an exporter every second, quantile_over_time recording rules "
        "every report interval), side by side, and print one JSON line: each system's CPU seconds, peak RSS and "
        f"freshness (newest sample → result visible) p50/p99. Needs {PROMETHEUS} (Debian package prometheus): "
        f"without it the bench prints `{INSTALL_COMMAND}` and exits 2; it never installs anything itself. "
        "The module docstring says what is and is not equal between the two.",
    )
    p.add_argument("--nodes", type=int, default=200, help="simulated nodes (200: about 3 minutes in all)")
    p.add_argument("--pods", type=int, default=100, help="pods per node in koordbus's batches (100)")
    p.add_argument("--interval", type=float, default=10.0, help="agent publish interval in seconds (10)")
    p.add_argument(
        "--report-interval",
        type=int,
        default=60,
        help="seconds between NodeMetric reports and between Prometheus rule evaluations (60; at least 30, "
        "a multiple of --interval)",
    )
    p.add_argument("--duration", type=float, default=150.0, help="measured seconds, after the warm-up (150)")
    p.add_argument("--warmup", type=float, default=30.0, help="seconds of load excluded from the figures (30)")
    p.add_argument(
        "--nodes-per-target",
        type=int,
        default=1,
        help="nodes per Prometheus scrape target (1: a target per node, like a node exporter on each node)",
    )
    p.add_argument(
        "--service-cpu",
        type=int,
        default=max(os.sched_getaffinity(0)),
        help="CPU of the nodemetric service; the rest of the benchmark avoids it (default: the last CPU)",
    )
    p.add_argument("--prometheus-cpu", type=int, help="CPU of Prometheus (default: --service-cpu)")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (stores, configs, logs)")
    args = p.parse_args(argv)
    if min(args.nodes, args.pods, args.nodes_per_target) < 1:
        p.error("--nodes, --pods and --nodes-per-target must be at least 1")
    if args.interval <= 0 or args.duration <= 0 or args.warmup < 0:
        p.error("--interval and --duration must be positive, --warmup not negative")
    if args.report_interval < 30 or args.report_interval % args.interval:
        p.error("--report-interval must be at least 30 s (koordlet's floor) and a multiple of --interval")
    if args.prometheus_cpu is None:
        args.prometheus_cpu = args.service_cpu
    cpus = os.sched_getaffinity(0)
    if {args.service_cpu, args.prometheus_cpu} - cpus:
        p.error(f"--service-cpu and --prometheus-cpu must be among this process's CPUs {sorted(cpus)}")
    return args


def command_line(args: argparse.Namespace) -> str:
    parts = ["python", "bench/compare_prometheus.py", "--nodes", str(args.nodes), "--pods", str(args.pods)]
    parts += ["--interval", f"{args.interval:g}", "--report-interval", str(args.report_interval)]
    parts += ["--duration", f"{args.duration:g}", "--warmup", f"{args.warmup:g}"]
    parts += ["--nodes-per-target", str(args.nodes_per_target)]
    parts += ["--service-cpu", str(args.service_cpu), "--prometheus-cpu", str(args.prometheus_cpu)]
    return shlex.join(parts)


# --- Prometheus over HTTP


def http_get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


async def prometheus_query(port: int, expr: str, *, at: float | None = None) -> list[tuple[dict[str, str], float]]:
    """An instant query's vector: (labels, value) per series."""
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    url = f"http://127.0.0.1:{port}/api/v1/query?{urllib.parse.urlencode(params)}"
    body = json.loads(await asyncio.to_thread(http_get, url))
    if body.get("status") != "success":
        raise RuntimeError(f"Prometheus query {expr!r} failed: {body}")
    return [(item["metric"], float(item["value"][1])) for item in body["data"]["result"]]


async def wait_ready(url: str, what: str, process_alive: Any, log_path: Path) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if not process_alive():
            raise RuntimeError(f"{what} exited during start-up:\n{processes.tail(log_path)}")
        try:
            await asyncio.to_thread(http_get, url)
            return
        except OSError:
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{what} was not ready within {READY_TIMEOUT_SECONDS:.0f} s:\n{processes.tail(log_path)}")


@dataclass(frozen=True)
class Round:
    evaluated_at: float
    """The rule outputs' timestamp: Prometheus evaluated the round's rules at this instant."""
    seen_at: float
    """When this bench's poll first saw the round's last rule output."""


async def watch_rounds(port: int, *, rule: str, node: str, until: float) -> list[Round]:
    """Poll the last rule's output for one node; each new timestamp is a round that just became visible."""
    rounds: list[Round] = []
    unknown = object()  # an output already there at the first poll may be old: only later changes are rounds
    last: object = unknown
    while time.time() < until:
        result = await prometheus_query(port, f'timestamp({rule}{{node="{node}"}})')
        seen_at = time.time()
        evaluated_at = result[0][1] if result else None
        if evaluated_at is not None and last is not unknown and evaluated_at != last:
            rounds.append(Round(evaluated_at=evaluated_at, seen_at=seen_at))
        last = evaluated_at
        await asyncio.sleep(POLL_SECONDS)
    return rounds


async def prometheus_freshness(port: int, rounds: list[Round]) -> list[float]:
    """Per round and node: seen − that node's newest sample at the evaluation instant."""
    _, series = promsetup.RESOURCES[0]
    values: list[float] = []
    for round_ in rounds:
        newest = await prometheus_query(port, f"timestamp({series})", at=round_.evaluated_at)
        values += [round_.seen_at - t for _, t in newest]
    return values


async def rule_group_state(port: int) -> dict[str, Any]:
    """The group's last evaluation time and failures (Prometheus's own account), from /api/v1/rules."""
    body = json.loads(await asyncio.to_thread(http_get, f"http://127.0.0.1:{port}/api/v1/rules"))
    groups = body["data"]["groups"]
    rules = [r for g in groups for r in g["rules"]]
    return {
        "rules": len(rules),
        "rule_errors": sum(1 for r in rules if r.get("health") != "ok"),
        "last_group_eval_s": round(max((g["evaluationTime"] for g in groups), default=0.0), 3),
    }


# --- koordbus's NodeMetricComputed, read back from its stream


@dataclass(frozen=True)
class KoordbusReports:
    freshness: list[float]
    """Per report: stored in the stream − newest sample."""
    batching: list[float]
    """Per report: the agent's send time of the completing batch − newest sample."""


async def koordbus_reports(bus: JetStreamBus, *, since: float, until: float, limit: int) -> KoordbusReports:
    decoder = msgspec.json.Decoder(NodeMetricComputedRecord)
    freshness: list[float] = []
    batching: list[float] = []
    deliveries = await bus.read_recent(
        streams.KOORD_NODEMETRIC, subjects.NODEMETRIC_COMPUTED_ALL, since=since, limit=limit
    )
    for delivery in deliveries:
        if delivery.published_at > until:
            continue
        report = decoder.decode(delivery.data)
        newest_sample = report.report_time - SAMPLE_STEP_SECONDS
        freshness.append(delivery.published_at - newest_sample)
        batching.append(report.source_sent_at - newest_sample)
    return KoordbusReports(freshness=freshness, batching=batching)


async def cross_check(bus: JetStreamBus, port: int, node: str) -> dict[str, Any]:
    """One node's CPU average and p95 over 5 min from both systems at koordbus's latest report time: the same data
    gives nearly the same numbers (nearest rank vs interpolation). Prometheus scrapes the exporter from before the
    agents start, so its range is cut to the seconds koordbus has samples for (from the node's first batch):
    otherwise a short run compares different spans. koordbus leaves a duration empty until its samples span half of
    it (cold start): p95 is null before 150 s."""
    delivery = await bus.last_on_subject(streams.KOORD_NODEMETRIC, subjects.stored(subjects.nodemetric_computed(node)))
    if delivery is None:
        return {}
    report = msgspec.json.decode(delivery.data, type=NodeMetricComputed)
    batches = await bus.read_recent(
        streams.KOORD_NODE, subjects.stored(subjects.node_metrics(node)), since=0, limit=100_000
    )
    first_sample = min((NODE_EVENT_DECODER.decode(b.data).window_start for b in batches), default=0.0)
    span = int(min(300, max(report.report_time - first_sample, 1)))
    usage = {a.duration_seconds: a.usage for a in report.status.node_metric.aggregated_node_usages}
    _, series = promsetup.RESOURCES[0]
    figures: dict[str, Any] = {"node": node, "report_time": report.report_time, "span_s": span}
    for name, koordbus, expr in (
        ("avg", report.status.node_metric.node_usage, f'avg_over_time({series}{{node="{node}"}}[{span}s])'),
        ("p95", usage.get(300, {}).get("p95"), f'quantile_over_time(0.95, {series}{{node="{node}"}}[{span}s])'),
    ):
        vector = await prometheus_query(port, expr, at=report.report_time)
        figures[f"koordbus_cpu_{name}_5m_millicores"] = koordbus.resources.get("cpu") if koordbus else None
        figures[f"prometheus_cpu_{name}_5m_millicores"] = round(vector[0][1] * 1000) if vector else None
    return figures


# --- the run


@dataclass(frozen=True)
class Pids:
    service: int
    nats: int
    prometheus: int
    exporter: int

    def read(self) -> dict[str, measure.ProcSample]:
        return {name: measure.read_proc(pid) for name, pid in vars(self).items()}


def write_prometheus_files(args: argparse.Namespace, workdir: Path, exporter_port: int) -> Path:
    durations = settings_loader.load(NodeMetricSettings).aggregate_durations_seconds
    rules = workdir / "rules.json"
    rules.write_text(json.dumps(promsetup.recording_rules(durations, interval_seconds=args.report_interval)))
    config = workdir / "prometheus.json"
    config.write_text(
        json.dumps(
            promsetup.scrape_config(
                exporter_port=exporter_port,
                nodes=args.nodes,
                nodes_per_target=args.nodes_per_target,
                rules_file=str(rules),
            )
        )
    )
    return config


def start_exporter(ctx: SpawnContext, args: argparse.Namespace, port: int) -> tuple[Any, Any, Any, Any]:
    config = node_exporter.ExporterConfig(
        port=port, nodes=args.nodes, pods=args.pods, interval=args.interval, nodes_per_target=args.nodes_per_target
    )
    scrapes, ready, stop = ctx.Value("d", 0.0), ctx.Event(), ctx.Event()
    process = ctx.Process(target=node_exporter.run_exporter, args=(config, scrapes, ready, stop), name="exporter")
    process.start()
    return process, scrapes, ready, stop


def seconds_of(after: measure.ProcSample, before: measure.ProcSample) -> float:
    return round(after.cpu_seconds - before.cpu_seconds, 2)


def mib(sample: measure.ProcSample) -> float:
    return round(sample.rss_peak_bytes / 2**20, 1)


def rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    ctx = multiprocessing.get_context("spawn")
    service_port, prometheus_port, exporter_port = (nodemetric_ingest.free_port() for _ in range(3))
    os.environ["KOORDBUS_REPORT_INTERVAL_SECONDS"] = str(args.report_interval)
    config = write_prometheus_files(args, workdir, exporter_port)
    exporter, scrapes, exporter_ready, exporter_stop = start_exporter(ctx, args, exporter_port)
    try:
        async with EmbeddedNatsServer(workdir / "nats", log_file=workdir / "nats-server.log") as server:
            log.info("nats-server at %s; data in %s", server.url, workdir)
            bus = await JetStreamBus.connect(server.url, name="bench")
            try:
                await bus.ensure_streams([streams.node_stream(), streams.nodemetric_stream(), streams.dlq_stream()])
                service_log, prometheus_log = workdir / "service.log", workdir / "prometheus.log"
                arguments = ["nodemetric", "--nats-url", server.url, "--port", str(service_port)]
                arguments += ["--database-url", f"sqlite:///{workdir / 'bench.db'}"]
                command = [str(PROMETHEUS), f"--config.file={config}", f"--storage.tsdb.path={workdir / 'tsdb'}"]
                command += [f"--web.listen-address=127.0.0.1:{prometheus_port}", "--log.level=warn"]
                with (
                    processes.pinned_service(arguments, cpu=args.service_cpu, log_path=service_log) as service,
                    processes.pinned_process(command, cpu=args.prometheus_cpu, log_path=prometheus_log) as prometheus,
                ):
                    await nodemetric_ingest.wait_for_service(service_port, service, service_log)
                    ready_url = f"http://127.0.0.1:{prometheus_port}/-/ready"
                    await wait_ready(ready_url, "Prometheus", lambda: prometheus.poll() is None, prometheus_log)
                    if not await asyncio.to_thread(exporter_ready.wait, READY_TIMEOUT_SECONDS):
                        raise RuntimeError("the exporter did not start listening")
                    pids = Pids(service=service.pid, nats=server.pid, prometheus=prometheus.pid, exporter=exporter.pid)
                    log.info("service pid %d, Prometheus pid %d on port %d", service.pid, prometheus.pid,
                             prometheus_port)  # fmt: skip
                    configs = [
                        loadgen.GeneratorConfig(
                            index=0, generators=1, nats_url=server.url, nodes=args.nodes, pods=args.pods,
                            interval=args.interval,
                        )
                    ]  # fmt: skip
                    with nodemetric_ingest.generator_processes(ctx, configs) as counters:
                        await nodemetric_ingest.wait_for_first_publishes(counters, args.interval)
                        load_started = time.monotonic()
                        log.info("load is flowing to both; warming up for %g s", args.warmup)
                        await processes.pause(args.warmup)
                        start_wall, first = time.time(), await measured_snapshot(service_port, pids)
                        scrapes_before = scrapes.value
                        durations = settings_loader.load(NodeMetricSettings).aggregate_durations_seconds
                        watcher = asyncio.create_task(
                            watch_rounds(
                                prometheus_port,
                                rule=promsetup.last_rule(durations),
                                node=simulated_node_names(args.nodes)[-1],
                                until=start_wall + args.duration,
                            )
                        )
                        log.info("measuring for %g s", args.duration)
                        await progress(args.duration, pids, first[1], prometheus=prometheus, service=service)
                        end_wall, last = time.time(), await measured_snapshot(service_port, pids)
                        scrapes_served = scrapes.value - scrapes_before
                        rounds = await watcher
                        load_seconds = time.monotonic() - load_started
                    reports = await koordbus_reports(
                        bus, since=start_wall, until=end_wall, limit=args.nodes * 4 * (int(args.duration) // 30 + 2)
                    )
                    prom_fresh = await prometheus_freshness(prometheus_port, rounds)
                    group = await rule_group_state(prometheus_port)
                    check = await cross_check(bus, prometheus_port, simulated_node_names(args.nodes)[-1])
            finally:
                await bus.close()
    finally:
        exporter_stop.set()
        exporter.join(timeout=20)
        if exporter.is_alive():
            exporter.terminate()
            exporter.join()
    return result(
        args,
        first=first,
        last=last,
        seconds=end_wall - start_wall,
        load_seconds=load_seconds,
        reports=reports,
        prometheus_freshness=prom_fresh,
        rounds=len(rounds),
        group=group,
        scrapes=scrapes_served,
        check=check,
    )


Snapshot = tuple[measure.ServiceMetrics, dict[str, measure.ProcSample]]


async def measured_snapshot(port: int, pids: Pids) -> Snapshot:
    text = await asyncio.to_thread(nodemetric_ingest.scrape, port)
    return measure.parse_metrics(text), pids.read()


async def progress(
    duration: float, pids: Pids, first: dict[str, measure.ProcSample], *, prometheus: Any, service: Any
) -> None:
    """Sleep through the measured period, logging each process's CPU use so far and failing if one died."""
    end = time.monotonic() + duration
    while (left := end - time.monotonic()) > 0:
        await processes.pause(min(left, PROGRESS_EVERY_SECONDS))
        for name, process in (("Prometheus", prometheus), ("the nodemetric service", service)):
            if process.poll() is not None:
                raise RuntimeError(f"{name} died during the run")
        now = pids.read()
        log.info("CPU s so far: " + ", ".join(f"{k} {seconds_of(now[k], first[k])}" for k in now))


def result(
    args: argparse.Namespace,
    *,
    first: Snapshot,
    last: Snapshot,
    seconds: float,
    load_seconds: float,
    reports: KoordbusReports,
    prometheus_freshness: list[float],
    rounds: int,
    group: dict[str, Any],
    scrapes: float,
    check: dict[str, Any],
) -> dict[str, Any]:
    (m0, p0), (m1, p1) = first, last
    applied = measure.bucket_deltas(m1.latency, m0.latency)
    projected = measure.bucket_deltas(m1.projection_latency, m0.projection_latency)
    nm = settings_loader.load(NodeMetricSettings)
    longest = max(nm.aggregate_durations_seconds)
    q = measure.quantile
    return {
        "bench": "compare_prometheus",
        "nodes": args.nodes,
        "pods": args.pods,
        "interval_s": args.interval,
        "report_interval_s": args.report_interval,
        "duration_s": round(seconds, 3),
        # Both systems keep up to the longest window (30 min); before it is full both work on partial windows.
        "window_fill": round(min(load_seconds / longest, 1.0), 3),
        "koordbus": {
            "service_cpu_s": seconds_of(p1["service"], p0["service"]),
            "service_rss_peak_mb": mib(p1["service"]),
            "nats_cpu_s": seconds_of(p1["nats"], p0["nats"]),
            "nats_rss_peak_mb": mib(p1["nats"]),
            "reports": len(reports.freshness),
            "freshness_p50_s": rounded(q(reports.freshness, 0.5)),
            "freshness_p99_s": rounded(q(reports.freshness, 0.99)),
            "batching_p50_s": rounded(q(reports.batching, 0.5)),
            "batching_p99_s": rounded(q(reports.batching, 0.99)),
            "send_to_applied_p50_s": rounded(measure.histogram_quantile(0.5, applied)),
            "send_to_applied_p99_s": rounded(measure.histogram_quantile(0.99, applied)),
            "send_to_projected_p50_s": rounded(measure.histogram_quantile(0.5, projected)),
            "send_to_projected_p99_s": rounded(measure.histogram_quantile(0.99, projected)),
        },
        "prometheus": {
            "cpu_s": seconds_of(p1["prometheus"], p0["prometheus"]),
            "rss_peak_mb": mib(p1["prometheus"]),
            "exporter_cpu_s": seconds_of(p1["exporter"], p0["exporter"]),
            "scrape_targets": promsetup.shards(args.nodes, args.nodes_per_target),
            # Served by the exporter in the measured period: targets/s when every scrape arrived on time.
            "scrapes_per_s": round(scrapes / seconds, 1),
            "rounds": rounds,
            "freshness_values": len(prometheus_freshness),
            "freshness_p50_s": rounded(q(prometheus_freshness, 0.5)),
            "freshness_p99_s": rounded(q(prometheus_freshness, 0.99)),
            **group,
        },
        "cross_check": check,
        "command": command_line(args),
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not PROMETHEUS.exists():
        print(f"{PROMETHEUS} is missing: install it with `{INSTALL_COMMAND}` (as root) and run again", file=sys.stderr)
        return 2
    return processes.run_pinned_bench(args, run)


if __name__ == "__main__":
    sys.exit(main())
