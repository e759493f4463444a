"""NodeMetric ingest CPU: what one agent batch costs the nodemetric service's ingest handler, in one process.

Run as `python bench/nodemetric_cpu.py [flags]` (see --help) and, with tiny flags, by
tests/e2e/test_bench_nodemetric_cpu.py.

bench/nodemetric_ingest.py measures the whole path (a real nats-server, the service in its own process, the
database) and its latencies depend on everything sharing the machine; this one isolates the handler's CPU so a change
to the hot path can be compared before and after on a busy machine. It feeds N simulated nodes' batches (the
ingest bench's templates: bench.loadgen, with their training rounds and pod-list thinning) through the service's
real ingest handler (services.nodemetric.service._IngestHandler.handle: decode, window, training, due reports with
their prediction) in event-time order, without a bus or a database: the reports it makes are counted, not
published. After --warmup-minutes of simulated time (windows and models filling) it measures --minutes more and
prints one JSON line: the handler's CPU (process time) per batch on average and in the cheapest and the dearest
window (every window should cost about the same: one dearer than the others is a backlog at 10,000 nodes), the
batches per second one core could take at the average and at the dearest window's cost, and the reports and training
rounds made meanwhile, and `calibration_ms`, the CPU time of a fixed pure-Python loop (this machine's speed varies
from day to day: compare runs by their ratio to it, or interleave them). Each window's cost goes to stderr as it is
measured.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make `bench` and the packages importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry

from agent.batch import PodListThinner
from agent.settings import AgentSettings
from agent.simulate import simulated_node_names
from bench.loadgen import TemplatePool
from bus import subjects
from bus.api import Delivery
from bus.memory import MemoryBus
from services.nodemetric.service import NodeMetricService, _IngestHandler
from services.nodemetric.settings import NodeMetricSettings

log = logging.getLogger("bench.nodemetric_cpu")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python bench/nodemetric_cpu.py",
        description="Feed N simulated nodes' agent batches through the nodemetric ingest handler in one process (no "
        "bus, no database) and print one JSON line: CPU per batch and per report, and the batches per second one "
        "core could take at that cost.",
    )
    p.add_argument("--nodes", type=int, default=600, help="simulated nodes, one batch each per interval (600)")
    p.add_argument("--pods", type=int, default=100, help="pods per node (100; ~80%% are running at any time)")
    p.add_argument("--interval", type=float, default=10.0, help="agent publish interval in seconds (10)")
    p.add_argument("--warmup-minutes", type=float, default=6.0, help="simulated minutes not measured (6)")
    p.add_argument("--minutes", type=float, default=4.0, help="simulated minutes measured after the warm-up (4)")
    p.add_argument("--template-pool", type=int, default=64, help="distinct simulated nodes per window (64)")
    args = p.parse_args(argv)
    if args.nodes < 1 or args.pods < 0 or args.interval <= 0 or args.minutes <= 0 or args.warmup_minutes < 0:
        p.error("--nodes must be ≥ 1, --pods ≥ 0, --interval and --minutes > 0, --warmup-minutes ≥ 0")
    return args


def calibration_ms() -> float:
    """CPU milliseconds of a fixed pure-Python workload (the smallest of three): this machine's speed, which varies
    from day to day by half or more, so that runs on different days can be told apart from changes to the code."""
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        total = 0
        for i in range(2_000_000):
            total += i * i
        best = min(best, time.process_time() - began)
    return round(1e3 * best, 1)


def window_deliveries(
    pool: TemplatePool, names: list[str], thinners: dict[str, PodListThinner], start: float, interval: float, seq: int
) -> list[Delivery]:
    """Every node's batch for [start, start + interval), as the ingest consumer would hand them out."""
    templates = [pool.render(k, start, start + interval) for k in range(len(pool))]
    end = start + interval
    step = interval / len(names)
    out = []
    for i, name in enumerate(names):
        thinner = thinners.setdefault(name, PodListThinner(AgentSettings.pod_list_resend_batches))
        data = templates[i % len(templates)].stamp(name, end + i * step, thinner)
        seq += 1
        subject = subjects.node_metrics(name)
        out.append(Delivery(subject=subject, data=data, headers={}, stream_seq=seq, num_delivered=1, published_at=0.0))
    return out


async def run(args: argparse.Namespace) -> dict[str, Any]:
    names = simulated_node_names(args.nodes)
    pool = TemplatePool(min(args.template_pool, args.nodes), pods=args.pods)
    thinners: dict[str, PodListThinner] = {}
    settings = NodeMetricSettings()
    service = NodeMetricService(MemoryBus(), store=None, settings=settings, registry=CollectorRegistry())  # type: ignore[arg-type]
    handler = _IngestHandler(service)
    warmup_windows = round(args.warmup_minutes * 60 / args.interval)
    measured_windows = round(args.minutes * 60 / args.interval)
    start = (time.time() // 3600) * 3600 - (warmup_windows + measured_windows + 1) * args.interval
    seq = 0
    cpu = 0.0
    batches = reports = rounds = 0
    window_costs: list[float] = []
    for w in range(warmup_windows + measured_windows):
        deliveries = window_deliveries(pool, names, thinners, start + w * args.interval, args.interval, seq)
        seq += len(deliveries)
        measured = w >= warmup_windows
        rounds_before = service._metrics.training_rounds._value.get()
        gc.collect()
        began = time.process_time()
        for delivery in deliveries:
            await handler.handle(delivery)
        spent = time.process_time() - began
        made = len(handler._pending.reports)
        handler._pending.reports.clear()
        handler._pending.sent_at.clear()
        handler._pending.reported_before.clear()
        service.node_rows._rows.clear()
        if measured:
            cpu += spent
            window_costs.append(spent / len(deliveries))
            batches += len(deliveries)
            reports += made
            rounds += int(service._metrics.training_rounds._value.get() - rounds_before)
        log.info("window %d of %d%s: %.0f µs per batch", w + 1, warmup_windows + measured_windows,
                 " (measured)" if measured else "", 1e6 * spent / len(deliveries))  # fmt: skip
    per_batch = cpu / batches
    return {
        "bench": "nodemetric_cpu",
        "command": " ".join(["python bench/nodemetric_cpu.py", *sys.argv[1:]]),
        "nodes": args.nodes,
        "pods": args.pods,
        "batches": batches,
        "reports": reports,
        "training_rounds": rounds,
        "cpu_s": round(cpu, 3),
        "cpu_per_batch_us": round(1e6 * per_batch, 1),
        "batches_per_core_s": round(1 / per_batch, 1) if per_batch else None,
        "window_cpu_per_batch_us": {
            "min": round(1e6 * min(window_costs), 1),
            "max": round(1e6 * max(window_costs), 1),
        },
        "busiest_window_batches_per_core_s": round(1 / max(window_costs), 1),
        "calibration_ms": calibration_ms(),
    }


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s", stream=sys.stderr)
    args = parse_args(argv)
    print(json.dumps(asyncio.run(run(args))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
