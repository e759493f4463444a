"""Scale-out benchmark: the nodemetric ingest benchmark with 1 replica, then with 2, on the same offered load.

Run as `python bench/scale.py [flags]` (the flags of bench/nodemetric_ingest.py; see --help) and, with tiny flags,
by tests/e2e/test_bench_scale_smoke.py. Each run is a whole bench.nodemetric_ingest run in its own temporary
directory (a fresh nats-server and SQLite database): first one `koordbus service nodemetric`, pinned to
--service-cpu, then --replicas (2) of them with instance names, which split the 16 node partitions between them,
each pinned to a CPU of its own. Prints one JSON line: both runs' figures, the batches/s each achieved, the speed-up
and the service CPU spent per batch. Offer more than one replica can ingest (the default 20,000 nodes at a 10 s
interval are 2,000 batches/s) to see the throughput scale; at a load one replica holds, both runs achieve the
offered rate and only the CPU per replica tells them apart.

What a machine can show depends on its CPUs: the replicas only add throughput while each has a CPU that the
nats-server and the load generator do not also need. On 2 CPUs the second replica shares its CPU with them, so a
speed-up well short of 2× is the machine's limit, not the partitioning's.
"""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script (`python bench/scale.py`): make `bench` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import nodemetric_ingest, processes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python bench/scale.py",
        description="Run the nodemetric ingest benchmark with one replica and then with --replicas of them (each "
        "pinned to its own CPU, splitting the node partitions) on the same offered load, and print one JSON line: "
        "batches/s achieved by each, the speed-up, service CPU per batch, latency and whether each held the target. "
        "Its defaults differ from the ingest benchmark's: --nodes 20000 (2,000 batches/s offered), --duration 60, "
        "--replicas 2.",
    )
    args = nodemetric_ingest.parse_args(argv, parser, defaults={"nodes": 20_000, "replicas": 2, "duration": 60.0})
    if args.replicas < 2:
        parser.error("--replicas: compare one replica with at least 2")
    if args.database_url:
        parser.error("--database-url: each run needs a fresh database; the runs use SQLite in their directories")
    return args


def command_line(args: argparse.Namespace) -> str:
    parts = ["python", "bench/scale.py", "--nodes", str(args.nodes), "--pods", str(args.pods)]
    parts += ["--interval", f"{args.interval:g}", "--duration", f"{args.duration:g}", "--warmup", f"{args.warmup:g}"]
    parts += ["--service-cpu", str(args.service_cpu), "--generators", str(args.generators)]
    parts += ["--replicas", str(args.replicas)]
    return shlex.join(parts)


def cpu_ms_per_batch(run: dict[str, Any]) -> float | None:
    rate = run["batches_per_s"]
    return round(1000 * run["service_cpu_cores"] / rate, 3) if rate > 0 else None


def result(args: argparse.Namespace, runs: list[dict[str, Any]]) -> dict[str, Any]:
    single, scaled = runs
    return {
        "bench": "scale",
        "service": "nodemetric",
        "nodes": args.nodes,
        "pods": args.pods,
        "interval_s": args.interval,
        "offered_batches_per_s": single["offered_batches_per_s"],
        "cpus": len(args.cpus),
        "replicas": [run["replicas"] for run in runs],
        "batches_per_s": [run["batches_per_s"] for run in runs],
        "speedup": round(scaled["batches_per_s"] / single["batches_per_s"], 3) if single["batches_per_s"] else None,
        "service_cpu_cores": [run["service_cpu_cores"] for run in runs],
        "cpu_ms_per_batch": [cpu_ms_per_batch(run) for run in runs],
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
        nodemetric_ingest.log.info("--- %d replica(s)", replicas)
        runs.append(await nodemetric_ingest.run(argparse.Namespace(**{**vars(args), "replicas": replicas}), directory))
    return result(args, runs)


def main(argv: list[str] | None = None) -> int:
    return processes.run_pinned_bench(parse_args(argv), run)


if __name__ == "__main__":
    sys.exit(main())
