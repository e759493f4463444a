"""Event subscriptions under load: C concurrent SSE clients of the API while the ingest benchmark runs.

Run as `python bench/subscriptions.py [flags]` (see --help) and, at toy size, by
tests/e2e/test_bench_subscriptions_smoke.py.

What runs: an embedded nats-server; `koordbus service nodemetric` (not pinned) fed by bench.loadgen's generators —
N nodes' agent batches every --interval, exactly as bench/nodemetric_ingest.py — and reporting every node's
NodeMetric every --report-interval (the events: `nodemetric.computed`, about N / report-interval per second);
`koordbus api` pinned to one CPU (everything else stays off it); and a client process holding C SSE
subscriptions to `/api/v1/events/stream?type=nodemetric.computed&node=<one node each>` (filtered clients,
nodes spread over the cluster) plus --broad clients with the type filter only (every event).

What is reported, over the measured period after --warmup: delivery latency p50/p99/max — the client's receive
time minus the event's `time` (when KOORD_NODEMETRIC stored it; one clock, one machine) — events delivered, the
API's CPU (cores) and peak RSS, subscriptions dropped, and whether the target held (p99 < 500 ms with every
client connected and none dropped).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import multiprocessing
import os
import shlex
import subprocess
import sys
import time
import urllib.request
from multiprocessing.context import SpawnContext
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agent.simulate import simulated_node_names
from bench import loadgen, measure, nodemetric_ingest, processes
from bus import streams
from bus.jetstream import JetStreamBus
from bus.server import EmbeddedNatsServer

log = logging.getLogger("bench.subscriptions")

TOKEN = "bench-subscriptions-token"
TARGET_P99_SECONDS = 0.5


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python bench/subscriptions.py",
        description="C concurrent SSE subscribers (each filtered to one node's nodemetric.computed events, plus a "
        "few unfiltered) on the koordbus API, pinned to one CPU, while N nodes' agent batches flow through the "
        "nodemetric service; prints one JSON line: delivery latency p50/p99, events delivered, the API's CPU and "
        "RSS, drops, and whether p99 < 500 ms held.",
    )
    p.add_argument("--clients", type=int, default=500, help="SSE clients, each filtered to one node (500)")
    p.add_argument("--broad", type=int, default=10, help="further clients filtered by type only: every event (10)")
    p.add_argument("--nodes", type=int, default=1000, help="simulated nodes (1000)")
    p.add_argument("--pods", type=int, default=100, help="pods per node (100)")
    p.add_argument("--interval", type=float, default=10.0, help="agent publish interval in seconds (10)")
    p.add_argument("--report-interval", type=int, default=30, help="seconds between a node's NodeMetric reports (30)")
    p.add_argument("--duration", type=float, default=120.0, help="measured seconds, after the warm-up (120)")
    p.add_argument("--warmup", type=float, default=60.0, help="seconds excluded from the figures (60)")
    p.add_argument(
        "--api-cpu",
        dest="service_cpu",
        type=int,
        default=max(os.sched_getaffinity(0)),
        help="CPU the API process is pinned to; the rest of the benchmark avoids it (default: the last CPU)",
    )
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (stores, logs)")
    args = p.parse_args(argv)
    if min(args.clients, args.nodes, args.pods) < 1 or args.broad < 0:
        p.error("--clients, --nodes and --pods must be at least 1, --broad not negative")
    if args.report_interval < 30 or args.interval <= 0 or args.duration <= 0 or args.warmup < 0:
        p.error("--report-interval must be at least 30, --interval and --duration positive, --warmup not negative")
    if args.service_cpu not in os.sched_getaffinity(0):
        p.error(f"--api-cpu {args.service_cpu} is not one of this process's CPUs {sorted(os.sched_getaffinity(0))}")
    return args


def command_line(args: argparse.Namespace) -> str:
    parts = ["python", "bench/subscriptions.py", "--clients", str(args.clients), "--broad", str(args.broad)]
    parts += ["--nodes", str(args.nodes), "--pods", str(args.pods), "--interval", f"{args.interval:g}"]
    parts += ["--report-interval", str(args.report_interval), "--duration", f"{args.duration:g}"]
    parts += ["--warmup", f"{args.warmup:g}", "--api-cpu", str(args.service_cpu)]
    return shlex.join(parts)


# --- the client process: C subscriptions on raw asyncio streams, latencies of events received after `measure_from`


async def _subscribe(
    port: int, path: str, latencies: list[float], measure_from: float, connected: list[int], ended: list[str]
) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port, limit=2**22)
    request = (
        f"GET {path} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n"
    )
    writer.write(request.encode())
    status = await reader.readline()
    if b" 200 " not in status:
        ended.append(status.decode(errors="replace").strip())
        return
    connected[0] += 1
    try:
        while line := await reader.readline():  # chunked framing lines are skipped: only `data: {` lines count
            if line.startswith(b"data: {") and b'"time":' in line:
                received = time.time()
                stored = float(line.split(b'"time":', 1)[1].split(b",", 1)[0])
                if received >= measure_from:
                    latencies.append(received - stored)
            elif line.startswith(b"event: dropped"):
                ended.append("dropped")
    finally:
        writer.close()


async def _clients(port: int, paths: list[str], measure_from: float, until: float, out: Any, ready: Event) -> None:
    latencies: list[float] = []
    connected = [0]
    ended: list[str] = []
    tasks = []
    for path in paths:  # connect at a steady pace, not all in one burst
        tasks.append(asyncio.create_task(_subscribe(port, path, latencies, measure_from, connected, ended)))
        await asyncio.sleep(0.002)
    deadline = time.time() + 60
    while connected[0] + len(ended) < len(paths) and time.time() < deadline:  # noqa: ASYNC110 - counts, no event
        await asyncio.sleep(0.1)
    ready.set()
    await asyncio.sleep(max(0.0, until - time.time()))
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    out.put({"latencies": latencies, "connected": connected[0], "ended": ended})


def run_clients(port: int, paths: list[str], measure_from: float, until: float, out: Any, ready: Event) -> None:
    asyncio.run(_clients(port, paths, measure_from, until, out, ready))


def client_paths(args: argparse.Namespace) -> list[str]:
    nodes = simulated_node_names(args.nodes)
    step = max(1, args.nodes // args.clients)
    filtered = [f"/api/v1/events/stream?type=nodemetric.computed&node={nodes[(i * step) % args.nodes]}"
                for i in range(args.clients)]  # fmt: skip
    return filtered + ["/api/v1/events/stream?type=nodemetric.computed"] * args.broad


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    ctx: SpawnContext = multiprocessing.get_context("spawn")
    service_port, api_port = nodemetric_ingest.free_port(), nodemetric_ingest.free_port()
    database_url = f"sqlite:///{workdir / 'bench.db'}"
    tokens = workdir / "tokens"
    tokens.write_text(f"{TOKEN} viewer bench\n")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KOORDBUS_REPORT_INTERVAL_SECONDS": str(args.report_interval),
           "KOORDBUS_EVENTS_MAX_SUBSCRIPTIONS": str(args.clients + args.broad + 10),
           "KOORDBUS_EVENTS_MAX_PER_CALLER": str(args.clients + args.broad + 10)}  # fmt: skip
    async with EmbeddedNatsServer(workdir / "nats", log_file=workdir / "nats-server.log") as server:
        log.info("nats-server at %s; data in %s", server.url, workdir)
        bus = await JetStreamBus.connect(server.url, name="bench")
        try:
            await bus.ensure_streams(streams.all_streams())
            service_log, api_log = workdir / "service.log", workdir / "api.log"
            service_cmd = [sys.executable, "-m", "koordbus.cli", "service", "nodemetric", "--nats-url", server.url,
                           "--database-url", database_url, "--port", str(service_port)]  # fmt: skip
            api_cmd = [sys.executable, "-m", "koordbus.cli", "api", "--nats-url", server.url, "--database-url",
                       database_url, "--port", str(api_port), "--api-tokens-file", str(tokens)]  # fmt: skip
            with processes.pinned_process(service_cmd, cpu=None, log_path=service_log, env=env) as service:
                await nodemetric_ingest.wait_for_service(service_port, service, service_log)
                with processes.pinned_process(api_cmd, cpu=args.service_cpu, log_path=api_log, env=env) as api:
                    await wait_until_ready(api_port, api, api_log)
                    log.info("API pid %d on CPU %d; %d clients", api.pid, args.service_cpu, args.clients + args.broad)
                    configs = [loadgen.GeneratorConfig(index=0, generators=1, nats_url=server.url, nodes=args.nodes,
                                                       pods=args.pods, interval=args.interval, pool_size=64,
                                                       max_in_flight=256)]  # fmt: skip
                    with nodemetric_ingest.generator_processes(ctx, configs) as counters:
                        await nodemetric_ingest.wait_for_first_publishes(counters, args.interval)
                        measure_from = time.time() + args.warmup
                        until = measure_from + args.duration
                        out, ready = ctx.Queue(), ctx.Event()
                        clients = ctx.Process(
                            target=run_clients, args=(api_port, client_paths(args), measure_from, until, out, ready)
                        )
                        clients.start()
                        await asyncio.to_thread(ready.wait, 90)
                        log.info("clients connected; warming up for %g s", max(0.0, measure_from - time.time()))
                        await asyncio.sleep(max(0.0, measure_from - time.time()))
                        first, first_at = measure.read_proc(api.pid), time.monotonic()
                        first_sent = sum(c.totals().published for c in counters)
                        await asyncio.sleep(max(0.0, until - time.time()))
                        last, last_at = measure.read_proc(api.pid), time.monotonic()
                        last_sent = sum(c.totals().published for c in counters)
                        metrics = await asyncio.to_thread(nodemetric_ingest.scrape, api_port)
                        collected = await asyncio.to_thread(out.get, True, 60)
                        clients.join(30)
                    if api.poll() is not None:
                        raise RuntimeError(f"the API died during the run:\n{processes.tail(api_log)}")
        finally:
            await bus.close()
    latencies: list[float] = collected["latencies"]
    seconds = last_at - first_at
    p99 = measure.quantile(latencies, 0.99)
    dropped = int(_metric(metrics, "koordbus_api_event_subscriptions_dropped_total"))
    total = args.clients + args.broad
    return {
        "bench": "subscriptions",
        "clients": args.clients,
        "broad_clients": args.broad,
        "connected": collected["connected"],
        "refused_or_ended": collected["ended"][:5],
        "nodes": args.nodes,
        "duration_s": round(seconds, 3),
        "ingest_batches_per_s": round((last_sent - first_sent) / seconds, 1),
        "events_delivered": len(latencies),
        "deliveries_per_s": round(len(latencies) / seconds, 1),
        "latency_p50_s": _rounded(measure.quantile(latencies, 0.5)),
        "latency_p99_s": _rounded(p99),
        "latency_max_s": _rounded(max(latencies) if latencies else None),
        "api_cpu_cores": round((last.cpu_seconds - first.cpu_seconds) / seconds, 3),
        "api_rss_peak_mb": round(last.rss_peak_bytes / 2**20, 1),
        "dropped": dropped,
        "target_held": bool(
            p99 is not None and p99 < TARGET_P99_SECONDS and collected["connected"] == total and dropped == 0
        ),
        "command": command_line(args),
    }


async def wait_until_ready(port: int, process: subprocess.Popen[bytes], log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the API exited during start-up:\n{processes.tail(log_path)}")
        with contextlib.suppress(OSError):
            await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/readyz", None, 5)
            return
        await asyncio.sleep(0.2)
    raise RuntimeError(f"the API was not ready within 60 s:\n{processes.tail(log_path)}")


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return 0.0


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def main(argv: list[str] | None = None) -> int:
    return processes.run_pinned_bench(parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
