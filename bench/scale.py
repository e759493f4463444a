"""Scale-out benchmark: a service's benchmark with 1 replica, then with 2, on the same offered load.

Run as `python bench/scale.py [--service nodemetric|noderesource] [flags]` (the flags of bench/nodemetric_ingest.py
or bench/noderesource.py; see --help) and, with tiny flags, by tests/e2e/test_bench_scale_smoke.py. Each run is a
whole run of that benchmark in its own temporary directory (a fresh nats-server and SQLite database): first one
`koordbus service …`, pinned to --service-cpu, then --replicas (2) of them with instance names, which split the 16
node partitions between them, each pinned to a CPU of its own. Prints one JSON line: both runs' figures, the rate
each achieved (agent batches ingested, or NodeMetrics decided), the speed-up and the service CPU per message.
Offer more than one replica can handle (the defaults do: 2,000 batches/s; 1,333 NodeMetrics/s) to see the
throughput scale; at a load one replica holds, both runs achieve the offered rate and only the CPU per replica
tells them apart.

What a machine can show depends on its CPUs: the replicas only add throughput while each has a CPU that the
nats-server and the load generator do not also need. On 2 CPUs the second replica shares its CPU with them, so a
speed-up well short of 2× is the machine's limit, not the partitioning's.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any, Final

if __package__ in (None, ""):  # run as a script (`python bench/scale.py`): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import nodemetric_ingest, noderesource, processes


@dataclass(frozen=True)
class Service:
    """How to run and read one service's benchmark."""

    module: ModuleType
    """bench.nodemetric_ingest or bench.noderesource: parse_args(argv, parser, defaults), run, command_line."""
    offered: str
    achieved: str
    """The result keys of the rate offered and achieved."""
    defaults: dict[str, Any]


SERVICES: Final = {
    "nodemetric": Service(
        nodemetric_ingest,
        offered="offered_batches_per_s",
        achieved="batches_per_s",
        defaults={"nodes": 20_000, "duration": 60.0},  # 2,000 batches/s: more than one replica ingests
    ),
    "noderesource": Service(
        noderesource,
        offered="offered_nodemetrics_per_s",
        achieved="achieved_nodemetrics_per_s",
        defaults={"nodes": 2_000, "metric_interval": 1.5, "duration": 60.0},  # 1,333/s: more than one replica decides
    ),
}


log = logging.getLogger("bench")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    chooser = argparse.ArgumentParser(add_help=False)
    chooser.add_argument(
        "--service", choices=sorted(SERVICES), default="nodemetric", help="the service to scale out (nodemetric)"
    )
    known, rest = chooser.parse_known_args(argv)
    service = SERVICES[known.service]
    parser = argparse.ArgumentParser(
        prog="python bench/scale.py",
        parents=[chooser],
        description="Run a service's benchmark (--service: nodemetric runs bench/nodemetric_ingest.py, noderesource "
        "bench/noderesource.py) with one replica and then with --replicas of them (each pinned to its own CPU, "
        "splitting the node partitions) on the same offered load, and print one JSON line: the rate each achieved, "
        "the speed-up, service CPU per message, latency and whether each held the target. Defaults that differ from "
        "the benchmark's own: --replicas 2, "
        + ", ".join(f"--{k.replace('_', '-')} {v:g}" for k, v in service.defaults.items())
        + ".",
    )
    args = service.module.parse_args(rest, parser, defaults={"replicas": 2, **service.defaults})
    args.service = known.service
    if args.replicas < 2:
        parser.error("--replicas: compare one replica with at least 2")
    if args.database_url:
        parser.error("--database-url: each run needs a fresh database; the runs use SQLite in their directories")
    return args


def command_line(args: argparse.Namespace) -> str:
    flags = shlex.split(SERVICES[args.service].module.command_line(args))[2:]  # without `python bench/<x>.py`
    return shlex.join(["python", "bench/scale.py", "--service", args.service, *flags])


def cpu_ms_per_message(run: dict[str, Any], achieved: str) -> float | None:
    rate = run[achieved]
    return round(1000 * run["service_cpu_cores"] / rate, 3) if rate > 0 else None


def result(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    service = SERVICES[args.service]
    rates = [run[service.achieved] for run in runs]
    return {
        "bench": "scale",
        "service": args.service,
        "nodes": args.nodes,
        "pods": args.pods,
        "cpus": len(args.cpus),
        "replicas": [run["replicas"] for run in runs],
        "offered_per_s": runs[0][service.offered],
        # Agent batches applied (nodemetric) or NodeMetrics decided (noderesource) per second.
        "achieved_per_s": rates,
        "speedup": round(rates[1] / rates[0], 3) if rates[0] else None,
        "service_cpu_cores": [run["service_cpu_cores"] for run in runs],
        "replica_cpu_cores": [run["replica_cpu_cores"] for run in runs],
        "cpu_ms_per_message": [cpu_ms_per_message(run, service.achieved) for run in runs],
        "latency_p50_s": [run["latency_p50_s"] for run in runs],
        "latency_p99_s": [run["latency_p99_s"] for run in runs],
        "backlog_end": [run["backlog_end"] for run in runs],
        "target_held": [run["target_held"] for run in runs],
        "runs": runs,
        "command": command_line(args),
    }


async def run(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    runs = []
    for replicas in (1, args.replicas):
        directory = workdir / f"replicas-{replicas}"
        directory.mkdir()
        log.info("--- %s, %d replica(s)", args.service, replicas)
        module = SERVICES[args.service].module
        runs.append(await module.run(argparse.Namespace(**{**vars(args), "replicas": replicas}), directory))
    return result(args, runs)


def main(argv: list[str] | None = None) -> int:
    return processes.run_pinned_bench(parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
